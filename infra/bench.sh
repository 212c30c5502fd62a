#!/usr/bin/env bash
# Benchmarks of the service on this machine, printed as figures and ratios
# (docs/benchmarks.md records them). Not part of the test suite.
#   1. create, get, list(limit 20) and the approvals inbox under load (wrk) against
#      `agent-runs serve` (release build), and the same load against a
#      minimal hyper server answering a fixed JSON body: the ceiling (one
#      run), and the list ceiling (the 20-run page the service answered).
#      Under both wrk settings: 1 thread and 16 connections, 2 and 32. Get,
#      list and inbox alternate with their ceilings in three rounds of a
#      third of a load run each; their figures are the rounds' medians (the
#      inbox's beside the list's ceiling of its round). Create runs once.
#   1b. optional: the same get, list and create against the LangGraph dev
#      server (the nearest peer), when LANGGRAPH_VENV names a venv with it,
#      under both settings.
#   2. echo create -> succeeded latency seen by a client polling get.
#   2b. 1,000 Server-Sent Events streams open on runs while runs are created:
#      the server's memory and CPU, create throughput with and without them,
#      and how fast a cancel of every run reaches every stream.
#   2c. webhooks: deliveries per second from the embedded server to a local
#      receiver, and create throughput while an endpoint answers in 2 s.
#   2d. traces: get and create throughput with every span exported over
#      OTLP to a local collector, against traces off.
#   3. each Lambda function's init and invocation times under a Lambda
#      Runtime API stand-in, against the AWS API emulator.
#   4. each function's binary and zip size.
# Usage: bash infra/bench.sh [--no-build] [--load-only | --lambda-only] [seconds per load run, default 10]
#   --no-build reuses the release binaries already in target/release;
#   --load-only stops after sections 1 and 1b;
#   --lambda-only runs sections 3 and 4 alone.
# Section 4 also reports arm64 sizes when target/aarch64-unknown-linux-gnu/release
# holds the functions (built with ARM64=1: needs the aarch64 target and
# Debian's gcc-aarch64-linux-gnu as its linker).
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [ "${1:-}" = "--no-build" ]; then build=0; shift; fi
load_only=0
if [ "${1:-}" = "--load-only" ]; then load_only=1; shift; fi
lambda_only=0
if [ "${1:-}" = "--lambda-only" ]; then lambda_only=1; shift; fi
secs=${1:-10}
# The wrk setting of every load but section 1's (which runs both).
threads=2
connections=32

if ! command -v wrk > /dev/null; then
  echo "installing wrk (Debian package)"
  apt-get update -qq && apt-get install -y -qq wrk > /dev/null
fi
functions="create list get cancel decide extend decide-batch events approvals webhooks policies directory fallback worker sweeper dead-letter notifier deliver"
if [ "$build" = 1 ]; then
  cargo build --release --quiet --bins -p agent-runs -p agent-runs-bench $(printf -- '-p agent-runs-%s ' $functions)
  if [ "${ARM64:-0}" = 1 ]; then
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
      cargo build --release --quiet --target aarch64-unknown-linux-gnu $(printf -- '-p agent-runs-%s ' $functions)
  fi
fi
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

wait_for_line() { for _ in $(seq 1 200); do grep -q "^Listening on" "$1" && return 0; sleep 0.05; done; echo "no server in $1"; exit 1; }
addr_of() { sed -n 's|^Listening on http://\([^ ]*\).*|\1|p' "$1"; }

# wrk_run NAME URL [extra wrk args]: prints requests/s, p50 and p99 (ms).
wrk_run() {
  local name=$1 url=$2; shift 2
  wrk -t"$threads" -c"$connections" -d"${secs}s" --latency "$@" "$url" > "$work/$name.wrk"
  local rps p50 p99
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$work/$name.wrk")
  p50=$(awk '$1 == "50%" {print $2}' "$work/$name.wrk")
  p99=$(awk '$1 == "99%" {print $2}' "$work/$name.wrk")
  local errors
  errors=$(awk '/Non-2xx or 3xx responses/ {print $NF}' "$work/$name.wrk")
  printf "%-12s %10.0f req/s   p50 %8s   p99 %8s   %s\n" "$name" "$rps" "$p50" "$p99" "${errors:+non-2xx: $errors}"
  echo "$rps" > "$work/$name.rps"
}

# Section 1's wrk settings, THREADSxCONNECTIONS; use_setting S makes S the one wrk_run uses.
settings="1x16 2x32"
# Section 1's reads and their ceilings run in rounds of a third of a load run.
rounds=3
round_secs=$(( (secs + rounds - 1) / rounds ))
# ratio A B: A.rps over B.rps.
ratio() { awk -v a="$(cat "$work/$1.rps")" -v b="$(cat "$work/$2.rps")" 'BEGIN { printf "%.4f\n", a / b }'; }
# median: the middle of the rounds' numbers, one a line on standard input.
median() { sort -g | sed -n "$(( (rounds + 1) / 2 ))p"; }
# median_of_rounds NAME: NAME.rps becomes the median of NAME-<round>.rps.
median_of_rounds() {
  cat "$work/$1"-[0-9]*.rps | median > "$work/$1.rps"
  printf "%-16s %10.0f req/s, the median of %d rounds\n" "$1" "$(cat "$work/$1.rps")" "$rounds"
}
use_setting() {
  threads=${1%x*} connections=${1#*x}
  echo "-- wrk -t$threads -c$connections"
}

# drain ADDR AUTH NAME: waits until no run is queued, and says how long the
# workers took to finish the runs the load NAME created.
drain() {
  local started
  started=$(date +%s.%N)
  for _ in $(seq 1 600); do
    curl -s "http://$1/v1/agent/runs?status=queued&limit=1" -H "$2" | grep -q '"data":\[\]' && break
    sleep 0.2
  done
  awk -v created="$(awk '/requests in/ {print $1}' "$work/$3.wrk")" -v started="$started" -v now="$(date +%s.%N)" \
    'BEGIN { printf "the workers finished the %d runs created under load %.1f s after it ended\n", created, now - started }'
}

# Sections 3 and 4: the Lambda functions (run last, or alone with --lambda-only).
lambda_sections() {
echo "== 3a. Lambda init alone: each function started 5 times with nothing else running (exec to its first request for work; no AWS call is made in init)"
for fn in $functions; do
  env AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true \
    AWS_ENDPOINT_URL=http://127.0.0.1:9 AGENT_RUNS_TABLE=bench-runs AGENT_RUNS_QUEUE_URL=http://127.0.0.1:9/runs \
    AGENT_RUNS_WEBHOOK_QUEUE_URL=http://127.0.0.1:9/deliveries "$bin/lambda-cold-start" --init-only 5 "$bin/$fn"
done
echo "== 3. Lambda functions: init and invocations (Runtime API stand-in, AWS API emulator)"
source infra/moto.sh
install_moto
port=$(free_port)
start_moto "$port"; pids+=("$MOTO_PID")
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=testing \
  AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true
eval "$("$bin/agent-runs" aws-setup --template template.yaml --prefix bench)"
export AGENT_RUNS_TABLE AGENT_RUNS_QUEUE_URL AGENT_RUNS_WEBHOOK_QUEUE_URL
lambda_key=$("$bin/agent-runs" keys create --owner bench 2> /dev/null)
python3 - "$work" "$lambda_key" <<'PY'
import copy, json, sys
work, key = sys.argv[1], sys.argv[2]
base = json.load(open("crates/cli/tests/fixtures/apigw-v2-create-run.json"))
base["headers"]["authorization"] = f"Bearer {key}"
missing = "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9"
def http(name, method, path, body=None, query=""):
    event = copy.deepcopy(base)
    event["rawPath"], event["rawQueryString"] = path, query
    event["requestContext"]["http"].update(method=method, path=path)
    event["body"] = body
    json.dump(event, open(f"{work}/{name}.json", "w"))
http("create", "POST", "/v1/agent/runs", '{"input": "bench"}')
http("list", "GET", "/v1/agent/runs", query="limit=20")
http("get", "GET", f"/v1/agent/runs/{missing}")
http("cancel", "POST", f"/v1/agent/runs/{missing}/cancel")
http("decide", "POST", f"/v1/agent/runs/{missing}/approvals/apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9", '{"decision": "approve"}')
http("events", "GET", f"/v1/agent/runs/{missing}/events")
http("extend", "POST", f"/v1/agent/runs/{missing}/approvals/apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9/extend", '{"seconds": 3600}')
http("approvals", "GET", "/v1/approvals", query="limit=20")
decision = {"run_id": missing, "approval_id": "apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9", "decision": "approve"}
http("decide-batch", "POST", "/v1/approvals/batch", json.dumps({"decisions": [decision]}))
http("policies", "GET", "/v1/policies")
http("directory", "GET", "/v1/agents/echo")
http("fallback", "GET", "/v1/unknown")
http("webhooks", "GET", "/v1/webhooks", query="limit=20")
sqs = json.load(open("infra/events/sqs-run.json"))
sqs["Records"][0]["body"] = json.dumps({"run_id": missing, "owner": "bench"})
json.dump(sqs, open(f"{work}/worker.json", "w"))
json.dump(json.load(open("infra/events/schedule.json")), open(f"{work}/sweeper.json", "w"))
json.dump(sqs, open(f"{work}/dead-letter.json", "w"))
delivery = copy.deepcopy(sqs)
delivery["Records"][0]["body"] = json.dumps({"owner": "bench", "webhook_id": "wh_01JDQ3V7Q4K8Z2X9M5N6P7R8S9", "run_id": missing, "seq": 1})
json.dump(delivery, open(f"{work}/deliver.json", "w"))
stream = {"Records": [{"eventID": "1", "eventName": "INSERT", "eventVersion": "1.1", "eventSource": "aws:dynamodb", "awsRegion": "us-east-1",
  "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/bench-runs/stream/1",
  "dynamodb": {"ApproximateCreationDateTime": 1795303478, "SequenceNumber": "1", "SizeBytes": 100, "StreamViewType": "NEW_IMAGE",
    "Keys": {"pk": {"S": f"RUN#{missing}"}, "sk": {"S": "EV#000000000001"}},
    "NewImage": {"pk": {"S": f"RUN#{missing}"}, "sk": {"S": "EV#000000000001"}, "seq": {"N": "1"}, "type": {"S": "run.created"},
      "at": {"N": "1795303478123"}, "data": {"S": "{}"}, "owner": {"S": "bench"}}}}]}
json.dump(stream, open(f"{work}/notifier.json", "w"))
PY
for fn in $functions; do
  "$bin/lambda-cold-start" "$bin/$fn" "$work/$fn.json" 50
done

echo "== 4. function sizes (release profile; zip as Lambda takes it)"
for arch_dir in "$bin" target/aarch64-unknown-linux-gnu/release; do
  [ -x "$arch_dir/worker" ] || continue
  echo "-- $([ "$arch_dir" = "$bin" ] && uname -m || echo aarch64)"
  for fn in $functions; do
    python3 - "$arch_dir/$fn" <<'PY'
import io, os, sys, zipfile
path = sys.argv[1]
buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
    archive.write(path, "bootstrap")
print(f"{os.path.basename(path):<12} binary {os.path.getsize(path) / 1e6:5.1f} MB   zip {len(buffer.getvalue()) / 1e6:5.2f} MB")
PY
  done
done
}

if [ "$lambda_only" = 1 ]; then lambda_sections; exit 0; fi

echo "== machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -m); load ${secs}s; section 1 with 1 wrk thread and 16 connections, then 2 and 32; the rest with 2 and 32"

"$bin/fixed-json" 127.0.0.1:0 > "$work/fixed.out" & pids+=($!)
AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_MAX_ACTIVE_RUNS=100000000 AGENT_RUNS_LOG=warn \
  "$bin/agent-runs" serve --addr 127.0.0.1:0 --db "$work/runs.db" > "$work/serve.out" 2> "$work/serve.err" & pids+=($!)
wait_for_line "$work/fixed.out"; wait_for_line "$work/serve.out"
fixed=$(addr_of "$work/fixed.out"); serve=$(addr_of "$work/serve.out")
key=$(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/serve.out")
auth="Authorization: Bearer $key"

# Some runs to read: 100 echo runs.
for i in $(seq 1 100); do
  curl -s -X POST "http://$serve/v1/agent/runs" -H "$auth" -H 'Content-Type: application/json' -d "{\"input\": \"run $i\"}" > /dev/null
done
# And 40 waiting for a decision, for the inbox.
for i in $(seq 1 40); do
  curl -s -X POST "http://$serve/v1/agent/runs" -H "$auth" -H 'Content-Type: application/json' \
    -d "{\"agent\": \"script\", \"input\": \"approve Step $i\"}" > /dev/null
done
cat > "$work/create.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"input": "bench"}'
wrk.headers["Content-Type"] = "application/json"
LUA

# The list ceiling: the same bare server answering the page of 20 runs the
# service answers (realistic runs, byte for byte).
curl -s "http://$serve/v1/agent/runs?limit=20" -H "$auth" > "$work/page.json"
"$bin/fixed-json" 127.0.0.1:0 "$work/page.json" > "$work/fixed-list.out" & pids+=($!)
wait_for_line "$work/fixed-list.out"
fixed_list=$(addr_of "$work/fixed-list.out")

echo "== 1. throughput and latency under load (the page: $(wc -c < "$work/page.json") bytes)"
for setting in $settings; do
  use_setting "$setting"
  # The run a client polls is one it started: created now, not one the
  # creates of the setting before may have pushed out of the server's
  # cache of recent runs (which reads never fill).
  curl -s -X POST "http://$serve/v1/agent/runs" -H "$auth" -H 'Content-Type: application/json' -d '{"input": "polled"}' > "$work/polled.json"
  polled=$(sed -n 's/.*"id":"\(run_[^"]*\)".*/\1/p' "$work/polled.json")
  # Each read alternates with its ceiling in short rounds, so that both see
  # the machine as it is then (a shared machine's speed drifts by a fifth
  # within a minute); a figure is the median of its rounds.
  for round in $(seq "$rounds"); do
    secs=$round_secs wrk_run "fixed-json-$setting-$round" "http://$fixed/"
    secs=$round_secs wrk_run "get-$setting-$round" "http://$serve/v1/agent/runs/$polled" -H "$auth"
    secs=$round_secs wrk_run "fixed-list-$setting-$round" "http://$fixed_list/"
    secs=$round_secs wrk_run "list-$setting-$round" "http://$serve/v1/agent/runs?limit=20" -H "$auth"
    secs=$round_secs wrk_run "inbox-$setting-$round" "http://$serve/v1/approvals?limit=20" -H "$auth"
  done
  for name in fixed-json get fixed-list list inbox; do median_of_rounds "$name-$setting"; done
  wrk_run "create-$setting" "http://$serve/v1/agent/runs" -H "$auth" -s "$work/create.lua"
  for op in get:fixed-json list:fixed-list inbox:fixed-list; do
    for round in $(seq "$rounds"); do
      ratio "${op%%:*}-$setting-$round" "${op#*:}-$setting-$round"
    done | median > "$work/${op%%:*}-$setting.ratio"
  done
  ratio "create-$setting" "fixed-json-$setting" > "$work/create-$setting.ratio"
  for op in get:fixed-json list:fixed-list inbox:fixed-list create:fixed-json; do
    awk -v op="${op%%:*}" -v ceiling="${op#*:}" -v ratio="$(cat "$work/${op%%:*}-$setting.ratio")" \
      'BEGIN { printf "%-8s %5.1f%% of the %s ceiling\n", op, 100 * ratio, ceiling }'
  done
  # Let the workers finish the created runs (the backlog of the create run):
  # how long that takes is the workers' throughput.
  drain "$serve" "$auth" "create-$setting"
done
threads=2 connections=32

echo "== 1b. the nearest peer: the LangGraph dev server (optional; LANGGRAPH_VENV names a venv with it)"
# Set up once: python3 -m venv .venv-langgraph && .venv-langgraph/bin/pip install \
#   "langgraph-cli[inmem]==0.4.40" "langgraph-api==0.16.7"
# then LANGGRAPH_VENV=.venv-langgraph bash infra/bench.sh. Its in-memory runtime, an echo graph,
# the same wrk settings; runs are created on one thread, as our runs belong to one owner.
if [ -x "${LANGGRAPH_VENV:-/nonexistent}/bin/langgraph" ]; then
  langgraph=$(cd "$LANGGRAPH_VENV" && pwd)/bin/langgraph
  mkdir -p "$work/peer"
  cp infra/bench/langgraph/echo_graph.py infra/bench/langgraph/langgraph.json "$work/peer/"
  peer_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  (cd "$work/peer" && LANGGRAPH_CLI_NO_ANALYTICS=1 exec "$langgraph" dev --host 127.0.0.1 --port "$peer_port" \
     --no-browser --no-reload > "$work/peer.log" 2>&1) & pids+=($!)
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$peer_port/ok" > /dev/null && break; sleep 0.2; done
  peer="http://127.0.0.1:$peer_port"
  thread=$(curl -s -X POST "$peer/threads" -H 'Content-Type: application/json' -d '{}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["thread_id"])')
  for i in $(seq 1 100); do
    curl -s -X POST "$peer/threads/$thread/runs" -H 'Content-Type: application/json' \
      -d "{\"assistant_id\": \"echo\", \"input\": {\"text\": \"run $i\"}}" > "$work/peer-last.json"
  done
  peer_run=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$work/peer-last.json")
  cat > "$work/peer-create.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"assistant_id": "echo", "input": {"text": "bench"}}'
wrk.headers["Content-Type"] = "application/json"
LUA
  for setting in $settings; do
    use_setting "$setting"
    wrk_run "peer-get-$setting" "$peer/threads/$thread/runs/$peer_run"
    wrk_run "peer-list-$setting" "$peer/threads/$thread/runs?limit=20"
    wrk_run "peer-create-$setting" "$peer/threads/$thread/runs" -s "$work/peer-create.lua"
    for op in get list create; do
      awk -v op="$op" -v ours="$(cat "$work/$op-$setting.rps")" -v peer="$(cat "$work/peer-$op-$setting.rps")" \
        'BEGIN { printf "%-8s ours %.0f req/s, the peer %.0f req/s: %.1f times\n", op, ours, peer, ours / peer }'
    done
  done
  threads=2 connections=32
  kill "${pids[-1]}" 2>/dev/null || true
else
  echo "skipped: LANGGRAPH_VENV does not name a venv with langgraph (see infra/bench.sh)"
fi

if [ "$load_only" = 1 ]; then exit 0; fi

echo "== 2. echo create -> succeeded, one client polling get"
"$bin/echo-latency" "$serve" "$key" 500

echo "== 2b. 1,000 clients following runs as Server-Sent Events while runs are created"
# A server of its own, with room for the streams and the load's connections.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_MAX_ACTIVE_RUNS=100000000 AGENT_RUNS_LOG=warn \
  "$bin/agent-runs" serve --addr 127.0.0.1:0 --db "$work/sse.db" --max-connections 4096 > "$work/sse-serve.out" 2> "$work/sse-serve.err" & sse_server=$!; pids+=($sse_server)
wait_for_line "$work/sse-serve.out"
sse=$(addr_of "$work/sse-serve.out")
sse_key=$(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/sse-serve.out")
wrk_run create-alone "http://$sse/v1/agent/runs" -H "Authorization: Bearer $sse_key" -s "$work/create.lua"
drain "$sse" "Authorization: Bearer $sse_key" create-alone
"$bin/sse-subscribers" "$sse" "$sse_key" 1000 $((secs + 2)) "$sse_server" > "$work/sse.out" 2>&1 & sse_client=$!; pids+=($sse_client)
for _ in $(seq 1 1200); do grep -q "^READY" "$work/sse.out" && break; sleep 0.1; done
grep -v "^READY" "$work/sse.out"
wrk_run create-1k-sse "http://$sse/v1/agent/runs" -H "Authorization: Bearer $sse_key" -s "$work/create.lua"
wait "$sse_client"
sed -n '/^after the load/,$p' "$work/sse.out"
awk -v with="$(cat "$work/create-1k-sse.rps")" -v alone="$(cat "$work/create-alone.rps")" \
  'BEGIN { printf "create with 1,000 streams open: %.1f%% of create alone\n", 100 * with / alone }'

echo "== 2c. webhooks: deliveries per second; create beside an endpoint that takes 2 s to answer"
# webhook_server NAME SINK_DELAY_MS [none]: a server of its own with one
# endpoint for every event on a local sink (none: no endpoint); sets
# $hook_serve, $hook_auth and $hook_sink.
webhook_server() {
  "$bin/webhook-sink" 127.0.0.1:0 "$2" > "$work/$1-sink.out" & pids+=($!)
  AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_MAX_ACTIVE_RUNS=100000000 AGENT_RUNS_LOG=warn AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE=true \
    "$bin/agent-runs" serve --addr 127.0.0.1:0 --db "$work/$1.db" > "$work/$1-serve.out" 2> "$work/$1-serve.err" & pids+=($!)
  wait_for_line "$work/$1-sink.out"; wait_for_line "$work/$1-serve.out"
  hook_sink=$(addr_of "$work/$1-sink.out"); hook_serve=$(addr_of "$work/$1-serve.out")
  hook_auth="Authorization: Bearer $(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/$1-serve.out")"
  [ "${3:-}" = none ] && return
  curl -s -X POST "http://$hook_serve/v1/webhooks" -H "$hook_auth" -H 'Content-Type: application/json' \
    -d "{\"url\": \"http://$hook_sink/hook\", \"events\": [\"*\"]}" > /dev/null
}
# The same server without an endpoint, for comparison (a fresh database each).
webhook_server plain 0 none
wrk_run create-no-hook "http://$hook_serve/v1/agent/runs" -H "$hook_auth" -s "$work/create.lua"
webhook_server fast 0
wrk_run create-webhook "http://$hook_serve/v1/agent/runs" -H "$hook_auth" -s "$work/create.lua"
created=$(awk '/requests in/ {print $1}' "$work/create-webhook.wrk")
# An echo run has three events: created, started, succeeded.
expected=$((created * 3)); started=$(date +%s.%N); delivered=0
for _ in $(seq 1 1200); do
  delivered=$(curl -s "http://$hook_sink/count"); [ "$delivered" -ge "$expected" ] && break; sleep 0.25
done
awk -v n="$delivered" -v e="$expected" -v secs="$secs" -v started="$started" -v now="$(date +%s.%N)" \
  'BEGIN { printf "delivered %d of %d events of the runs created under load; all within %.1f s after the load: %.0f deliveries/s over load and drain\n", n, e, now - started, n / (secs + now - started) }'
webhook_server slow 2000
wrk_run create-slow-hook "http://$hook_serve/v1/agent/runs" -H "$hook_auth" -s "$work/create.lua"
awk -v slow="$(cat "$work/create-slow-hook.rps")" -v fast="$(cat "$work/create-webhook.rps")" -v alone="$(cat "$work/create-no-hook.rps")" \
  'BEGIN { printf "create with an endpoint for every event: %.1f%% of create without; with that endpoint taking 2 s: %.1f%%\n", 100 * fast / alone, 100 * slow / alone }'

echo "== 2d. traces: get and create with every span exported over OTLP, against the same with traces off"
# traced_server NAME [collector address]: a server of its own on a fresh
# database; with a collector, every span goes to it. Sets $traced and $traced_auth.
traced_server() {
  local otlp=()
  [ -n "${2:-}" ] && otlp=(OTEL_EXPORTER_OTLP_ENDPOINT="http://$2" OTEL_BSP_MAX_QUEUE_SIZE=65536)
  env AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_MAX_ACTIVE_RUNS=100000000 AGENT_RUNS_LOG=warn "${otlp[@]}" \
    "$bin/agent-runs" serve --addr 127.0.0.1:0 --db "$work/$1.db" > "$work/$1-serve.out" 2> "$work/$1-serve.err" & pids+=($!)
  wait_for_line "$work/$1-serve.out"
  traced=$(addr_of "$work/$1-serve.out")
  traced_auth="Authorization: Bearer $(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/$1-serve.out")"
  curl -s -X POST "http://$traced/v1/agent/runs" -H "$traced_auth" -H 'Content-Type: application/json' -d '{"input": "x"}' > "$work/$1-run.json"
}
# The servers of the sections above stop first (the slow endpoint's
# deliveries would still be running), then off and on take turns, twice,
# each on a server of its own that is stopped after it.
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
pids=(); sleep 1
# The collector: the webhook sink answers every POST (here /v1/traces) 204 and counts them.
"$bin/webhook-sink" 127.0.0.1:0 0 > "$work/collector.out" & pids+=($!)
wait_for_line "$work/collector.out"
collector=$(addr_of "$work/collector.out")
for round in 1 2; do
  for mode in off on; do
    traced_server "traces-$mode-$round" "$([ "$mode" = on ] && echo "$collector")"
    traced_run=$(sed -n 's/.*"id":"\(run_[^"]*\)".*/\1/p' "$work/traces-$mode-$round-run.json")
    wrk_run "get-traces-$mode-$round" "http://$traced/v1/agent/runs/$traced_run" -H "$traced_auth"
    wrk_run "create-traces-$mode-$round" "http://$traced/v1/agent/runs" -H "$traced_auth" -s "$work/create.lua"
    drain "$traced" "$traced_auth" "create-traces-$mode-$round"
    kill "${pids[-1]}"; sleep 1
  done
done
sleep 6  # the batch processor sends every 5 s
echo "the collector received $(curl -s "http://$collector/count") OTLP exports"
for op in get create; do
  awk -v op="$op" -v on1="$(cat "$work/$op-traces-on-1.rps")" -v off1="$(cat "$work/$op-traces-off-1.rps")" \
    -v on2="$(cat "$work/$op-traces-on-2.rps")" -v off2="$(cat "$work/$op-traces-off-2.rps")" \
    'BEGIN { printf "%-7s with traces exported: %.1f%% of traces off (rounds: %.1f%%, %.1f%%)\n", op, 100 * (on1 + on2) / (off1 + off2), 100 * on1 / off1, 100 * on2 / off2 }'
done

lambda_sections
