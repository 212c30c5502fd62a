# Helpers for the AWS API emulator (moto server), sourced by test.sh and emulator.sh.

MOTO_VERSION=5.2.5

# Installs the pinned moto server (and the test receiver's webhook library)
# into .venv once.
install_moto() {
  local installed
  installed=$(.venv/bin/pip freeze 2>/dev/null || true)
  if [ ! -x .venv/bin/moto_server ] || ! grep -qxF "moto==$MOTO_VERSION" <<< "$installed" \
      || ! grep -qxF "standardwebhooks==1.1.0" <<< "$installed"; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-test.txt
  fi
}

free_port() {
  .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_moto PORT: starts moto on 127.0.0.1:PORT in the background, sets
# MOTO_PID, and returns once it answers.
start_moto() {
  mkdir -p target
  # One request at a time, as DynamoDB isolates transactions (see the script).
  .venv/bin/python "$(dirname "${BASH_SOURCE[0]}")/moto_serial.py" "$1" > target/moto.log 2>&1 &
  MOTO_PID=$!
  .venv/bin/python - "$1" <<'PY'
import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("moto server did not start; see target/moto.log")
PY
}
