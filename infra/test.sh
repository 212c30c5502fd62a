#!/usr/bin/env bash
# The project's test command: everything the tests need, then `cargo test`.
# Run from anywhere: bash infra/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked "$@"
