#!/usr/bin/env bash
# POST /v1/policies/test over 10,000 decisions a person made: 21 candidate
# rules (20 with a `matches` condition), on the embedded server (SQLite;
# five rounds, each as curl times it); then the same history's reads from
# the gsi4 index on the AWS API emulator. docs/benchmarks.md.
# Usage (from the repository root, after `cargo build --release -p agent-runs`):
#   bash infra/bench-policy-test.sh [agent-runs binary]
set -euo pipefail
bin=${1:-target/release/agent-runs}
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
echo "== on SQLite (the embedded server)"
start
rules='{"limit": 10000, "rules": ['
for i in $(seq 1 20); do rules+="{\"id\": \"r$i\", \"tool\": \"delete_*\", \"effect\": \"allow\", \"when\": [{\"path\": \"/count\", \"op\": \"<=\", \"value\": $((i % 7))}, {\"path\": \"/branch\", \"op\": \"matches\", \"value\": \"feature/x[0-9]+$i\"}]},"; done
rules+='{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "when": [{"path": "/branch", "op": "==", "value": "main"}]}]}'
for round in 1 2 3 4 5; do
  curl -s -o "$work/out.json" -w "round $round: %{time_total} s\n" -X POST "http://$addr/v1/policies/test" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$rules"
done
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ['evaluated','would_allow','would_deny','would_ask']}, len(r['disagreements']), 'disagreements')" "$work/out.json"
kill $pid; wait $pid 2>/dev/null || true

echo "== on DynamoDB (the AWS API emulator): the history's reads from gsi4, as the store makes them"
# The emulator answers a Query page of the index in seconds (about 1.3 ms
# per item), past a store call's 2 s attempt limit (crates/platform/src/aws_sdk.rs), so
# the policies function cannot answer over 10,000 decisions there; the
# Query pages the store sends are timed here instead. The evaluation over
# them is what the SQLite rounds above time.
source infra/moto.sh
install_moto
port=$(free_port)
start_moto "$port"; moto_pid=$MOTO_PID
trap 'kill $pid $moto_pid 2>/dev/null || true; rm -rf "$work"' EXIT
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=testing \
  AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
eval "$("$bin" aws-setup --template template.yaml --prefix bench)"
.venv/bin/python - "$AGENT_RUNS_TABLE" <<'PY'
import boto3, json, os, random, sys, time
table = sys.argv[1]
dynamodb = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
items = []
for n in range(10_000):
    tool = random.choice(["delete_branch", "deploy", "read_file", "create_ticket"])
    args = json.dumps({"branch": random.choice(["main", "feature/x%d" % n, "release/%d" % n]), "count": n % 7}, separators=(",", ":"), sort_keys=True)
    human = random.choice(["approved", "approved", "edited", "rejected"])
    run, approval = "run_01M806T4VB%016d" % n, "apr_01M806T4VB%016d" % n
    # An approval.decided event item as the store writes one (its data cut short: the index projects only the call).
    items.append({"PutRequest": {"Item": {
        "pk": {"S": f"RUN#{run}"}, "sk": {"S": "EV#000000000003"}, "seq": {"N": "3"}, "type": {"S": "approval.decided"},
        "at": {"N": str(1795303478123 + n)}, "data": {"S": "{}"}, "fmt": {"N": "2"}, "owner": {"S": "bench"},
        "gsi4pk": {"S": "DEC#bench"}, "gsi4sk": {"S": "%013d#%s#%s" % (1795303478123 + n, run, approval)},
        "agent": {"S": "janitor"}, "call_tool": {"S": tool}, "call_arguments": {"S": args}, "decision": {"S": human}}}})
for start in range(0, len(items), 25):
    dynamodb.batch_write_item(RequestItems={table: items[start:start + 25]})
for round in (1, 2, 3):
    started, start, read, pages = time.time(), None, 0, []
    while read < 10_000:
        query = dict(TableName=table, IndexName="gsi4", KeyConditionExpression="gsi4pk = :pk",
                     ExpressionAttributeValues={":pk": {"S": "DEC#bench"}}, ScanIndexForward=False, Limit=10_000 - read,
                     ReturnConsumedCapacity="TOTAL")
        if start:
            query["ExclusiveStartKey"] = start
        page_started = time.time()
        page = dynamodb.query(**query)
        read += len(page["Items"])
        pages.append(f"{len(page['Items'])} items {time.time() - page_started:.2f} s")
        start = page.get("LastEvaluatedKey")
        if not start:
            break
    print(f"round {round}: {read} decisions in {len(pages)} Query pages, {time.time() - started:.2f} s ({'; '.join(pages)})")
PY
