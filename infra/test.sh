#!/usr/bin/env bash
# The project's test command. Lints template.yaml (cfn-lint, sam validate),
# starts the AWS API emulator (moto, pinned) on a free port on 127.0.0.1,
# runs every test of the workspace against it and against the embedded
# server, and stops the emulator on exit. Python tools go into .venv and
# .venv-lint (aws-sam-cli pins its own boto3, so it lives apart).
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

install_moto
port=$(free_port)
trap 'kill "$MOTO_PID" 2>/dev/null || true' EXIT
start_moto "$port"
echo "== moto server on 127.0.0.1:$port"

export AGENT_RUNS_TEST_AWS_ENDPOINT="http://127.0.0.1:$port"
cargo test --workspace --locked "$@"
echo "== reliability counts"
cat target/tmp/reliability-*.txt 2> /dev/null || true

# The OpenAPI document against the running server (needs target/debug/agent-runs, built above).
bash infra/api-conformance.sh
