#!/usr/bin/env bash
# Starts the AWS API emulator (moto) on 127.0.0.1:${PORT:-5000}, creates the
# table and queues exactly as template.yaml defines them, writes their names
# to infra/watch.env (read by `cargo lambda watch` and handy for
# `agent-runs gateway` and `agent-runs keys`), and keeps running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
source infra/moto.sh
port=${PORT:-5000}

install_moto
trap 'kill "$MOTO_PID" 2>/dev/null || true' EXIT
start_moto "$port"

export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_REGION=us-east-1 \
  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
resources=$(cargo run --quiet -p agent-runs -- aws-setup --template template.yaml --prefix agent-runs)
{
  echo "# Written by infra/emulator.sh: the local emulator and the resources it created."
  echo "AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL"
  echo "AWS_REGION=$AWS_REGION"
  echo "AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID"
  echo "AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
  echo "AWS_EC2_METADATA_DISABLED=true"
  echo "${resources//export /}"
} > infra/watch.env
echo "AWS API emulator on $AWS_ENDPOINT_URL; resources in infra/watch.env:"
cat infra/watch.env
echo "Ctrl-C stops the emulator (its data is kept in memory only)."
wait "$MOTO_PID"
