#!/usr/bin/env bash
# POST /v1/policies/test over 10,000 decisions a person made, on the embedded
# server (SQLite): 21 candidate rules (20 with a `matches` condition), five
# rounds, each round's time as curl sees it (docs/benchmarks.md).
# Usage: bash infra/bench-policy-test.sh [agent-runs binary, default the release build]
set -euo pipefail
bin=${1:-/work/main/target/release/agent-runs}
work=$(mktemp -d); trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
start() {
  AGENT_RUNS_LOG=warn AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 "$bin" serve --addr 127.0.0.1:0 --db "$work/runs.db" > "$work/serve.out" 2>&1 & pid=$!
  for _ in $(seq 1 200); do grep -q "^Listening on" "$work/serve.out" && break; sleep 0.05; done
  addr=$(sed -n 's|^Listening on http://\([^ ]*\).*|\1|p' "$work/serve.out")
}
start
key=$(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/serve.out")
owner=$(curl -s -X POST "http://$addr/v1/agent/runs" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d '{"input":"x"}' >/dev/null; sqlite3 "$work/runs.db" "SELECT owner FROM runs LIMIT 1" 2>/dev/null || python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT owner FROM runs LIMIT 1').fetchone()[0])" "$work/runs.db")
kill $pid; wait $pid 2>/dev/null || true
python3 - "$work/runs.db" "$owner" <<'PY'
import sqlite3, sys, json, random
db = sqlite3.connect(sys.argv[1]); owner = sys.argv[2]
rows = []
for n in range(10_000):
    tool = random.choice(["delete_branch", "deploy", "read_file", "create_ticket"])
    args = json.dumps({"branch": random.choice(["main", "feature/x%d" % n, "release/%d" % n]), "count": n % 7}, separators=(",", ":"), sort_keys=True)
    human = random.choice(["approved", "approved", "edited", "rejected"])
    rows.append((owner, "run_01M806T4VB%016d" % n, "apr_01M806T4VB%016d" % n, 1795303478123 + n, "janitor", tool, args, human))
db.executemany("INSERT INTO decisions VALUES (?,?,?,?,?,?,?,?)", rows); db.commit()
PY
start
rules='{"limit": 10000, "rules": ['
for i in $(seq 1 20); do rules+="{\"id\": \"r$i\", \"tool\": \"delete_*\", \"effect\": \"allow\", \"when\": [{\"path\": \"/count\", \"op\": \"<=\", \"value\": $((i % 7))}, {\"path\": \"/branch\", \"op\": \"matches\", \"value\": \"feature/x[0-9]+$i\"}]},"; done
rules+='{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "when": [{"path": "/branch", "op": "==", "value": "main"}]}]}'
for round in 1 2 3 4 5; do
  curl -s -o "$work/out.json" -w "round $round: %{time_total} s\n" -X POST "http://$addr/v1/policies/test" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$rules"
done
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ['evaluated','would_allow','would_deny','would_ask']}, len(r['disagreements']), 'disagreements')" "$work/out.json"
