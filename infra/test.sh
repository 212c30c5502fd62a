#!/usr/bin/env bash
# The project's test command. Installs the AWS API emulator (moto, pinned)
# into .venv, starts it on a free port on 127.0.0.1, runs every test of the
# workspace against it and the embedded server, and stops it on exit.
# Usage: bash infra/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ] || ! .venv/bin/pip freeze 2>/dev/null | grep -qxF "moto==5.2.5"; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-test.txt
fi

port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p target
.venv/bin/moto_server -H 127.0.0.1 -p "$port" > target/moto.log 2>&1 &
moto_pid=$!
trap 'kill "$moto_pid" 2>/dev/null || true' EXIT
.venv/bin/python - "$port" <<'PY'
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/", timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit("moto server did not start; see target/moto.log")
PY

export AGENT_RUNS_TEST_AWS_ENDPOINT="http://127.0.0.1:$port"
cargo test --workspace --locked "$@"
