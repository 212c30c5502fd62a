#!/usr/bin/env bash
# Two builds of `agent-runs` side by side: infra/bench.sh section 1's get,
# list and create against each, in turns, every round beside the fixed-JSON
# ceiling (docs/benchmarks.md). Build each first (`cargo build --release -p
# agent-runs -p agent-runs-bench`, copying target/release/agent-runs aside).
# Usage: bash infra/bench-ab.sh OLD_BINARY NEW_BINARY [ROUNDS, default 3]
set -euo pipefail
old=$1 new=$2 rounds=${3:-3} secs=10
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
wait_for_line() { for _ in $(seq 1 200); do grep -q "^Listening on" "$1" && return 0; sleep 0.05; done; echo "no server in $1"; exit 1; }
addr_of() { sed -n 's|^Listening on http://\([^ ]*\).*|\1|p' "$1"; }
rps() { wrk -t2 -c32 -d"${secs}s" "$@" | awk '/^Requests\/sec:/ {printf "%.0f", $2}'; }
"$(dirname "$0")/../target/release/fixed-json" 127.0.0.1:0 > "$work/fixed.out" & pids+=($!)
wait_for_line "$work/fixed.out"; fixed=$(addr_of "$work/fixed.out")
cat > "$work/create.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input": "bench"}'
wrk.headers["Content-Type"] = "application/json"
LUA
for round in $(seq 1 "$rounds"); do
  for which in old new; do
    bin=${!which}
    rm -rf "$work/db"; mkdir "$work/db"
    AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_MAX_ACTIVE_RUNS=100000000 AGENT_RUNS_LOG=warn \
      "$bin" serve --addr 127.0.0.1:0 --db "$work/db/runs.db" > "$work/serve.out" 2> "$work/serve.err" & server=$!
    wait_for_line "$work/serve.out"; serve=$(addr_of "$work/serve.out")
    key=$(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/serve.out"); auth="Authorization: Bearer $key"
    for i in $(seq 1 100); do
      curl -s -X POST "http://$serve/v1/agent/runs" -H "$auth" -H 'Content-Type: application/json' -d "{\"input\": \"run $i\"}" > "$work/last.json"
    done
    run_id=$(sed -n 's/.*"id":"\(run_[^"]*\)".*/\1/p' "$work/last.json")
    ceiling=$(rps "http://$fixed/")
    get=$(rps "http://$serve/v1/agent/runs/$run_id" -H "$auth")
    list=$(rps "http://$serve/v1/agent/runs?limit=20" -H "$auth")
    create=$(rps "http://$serve/v1/agent/runs" -H "$auth" -s "$work/create.lua")
    awk -v r="$round" -v w="$which" -v c="$ceiling" -v g="$get" -v l="$list" -v k="$create" \
      'BEGIN { printf "round %d %-3s ceiling %6d  get %6d (%4.1f%%)  list %6d (%4.1f%%)  create %6d (%4.1f%%)\n", r, w, c, g, 100*g/c, l, 100*l/c, k, 100*k/c }'
    kill "$server"; wait "$server" 2>/dev/null || true
  done
done
