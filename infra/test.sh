#!/usr/bin/env bash
# The project's test command. Lints template.yaml (cfn-lint, sam validate),
# starts the AWS API emulator (moto, pinned) on a free port on 127.0.0.1,
# runs every test of the workspace against it and against the embedded
# server, and stops the emulator on exit. Python tools go into .venv and
# .venv-lint (aws-sam-cli pins its own boto3, so it lives apart); the
# console's browser test needs Debian's chromium and chromium-driver
# (installed here when missing) and Selenium in .venv-console.
# Usage: bash infra/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/moto.sh

if [ ! -x .venv-lint/bin/sam ] || ! .venv-lint/bin/pip freeze 2>/dev/null | grep -qxF "cfn-lint==1.58.0"; then
  python3 -m venv .venv-lint
  .venv-lint/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-lint.txt
fi
echo "== template.yaml: cfn-lint, sam validate, sam validate --lint"
.venv-lint/bin/cfn-lint template.yaml
SAM_CLI_TELEMETRY=0 .venv-lint/bin/sam validate --template template.yaml --region us-east-1
SAM_CLI_TELEMETRY=0 .venv-lint/bin/sam validate --lint --template template.yaml --region us-east-1

# The console's browser test: Debian's Chromium and its driver, Selenium (pinned).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "== installing chromium and chromium-driver (Debian packages)"
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"   # never a password prompt
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium chromium-driver > /dev/null
fi
if [ ! -x .venv-console/bin/python ] || ! .venv-console/bin/pip freeze 2>/dev/null | grep -qxF "selenium==4.51.0"; then
  python3 -m venv .venv-console
  .venv-console/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-console.txt
fi
export AGENT_RUNS_TEST_BROWSER_PYTHON="$PWD/.venv-console/bin/python"

# The receipt test verifies approval receipts with npm's `jose` (pinned) too:
# Debian's Node.js when missing, the package in .node-receipts.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "== installing nodejs and npm (Debian packages)"
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq nodejs npm > /dev/null
fi
if [ "$(node -p 'require("./.node-receipts/node_modules/jose/package.json").version' 2>/dev/null)" != "6.2.18" ]; then
  npm install --silent --no-audit --no-fund --prefix .node-receipts jose@6.2.18 > /dev/null
fi
export AGENT_RUNS_TEST_NODE_DIR="$PWD/.node-receipts"
bash infra/console-typecheck.sh

install_moto
port=$(free_port)
trap 'kill "$MOTO_PID" 2>/dev/null || true' EXIT
start_moto "$port"
echo "== moto server on 127.0.0.1:$port"

export AGENT_RUNS_TEST_AWS_ENDPOINT="http://127.0.0.1:$port"
# The webhook tests' receiver verifies deliveries with standardwebhooks (in .venv).
export AGENT_RUNS_TEST_WEBHOOK_PYTHON="$PWD/.venv/bin/python"
# The digest test compares with an independent RFC 8785 implementation (in .venv).
export AGENT_RUNS_TEST_PYTHON="$PWD/.venv/bin/python"
cargo test --workspace --locked "$@"
echo "== reliability counts"
cat target/tmp/reliability-*.txt 2> /dev/null || true

# The OpenAPI document against the running server (needs target/debug/agent-runs, built above).
bash infra/api-conformance.sh

# Our MCP client against the official MCP conformance suite (needs the same binary).
bash infra/mcp-conformance.sh
