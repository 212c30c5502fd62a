# Helpers for the AWS API emulator (moto server), sourced by test.sh and emulator.sh.

MOTO_VERSION=5.2.5

# Installs the pinned moto server (and the tests' other Python libraries)
# into .venv, again whenever a pin of infra/requirements-test.txt is missing.
install_moto() {
  local installed pin missing=""
  installed=$(.venv/bin/pip freeze 2>/dev/null || true)
  for pin in $(grep -o '^[A-Za-z0-9_.-]*==[^ ]*' "$(dirname "${BASH_SOURCE[0]}")/requirements-test.txt" | sed 's/\[[^]]*\]//'); do
    grep -qixF "$pin" <<< "$installed" || missing=yes
  done
  if [ ! -x .venv/bin/moto_server ] || ! grep -qxF "moto==$MOTO_VERSION" <<< "$installed" || [ -n "$missing" ]; then
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
