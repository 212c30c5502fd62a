#!/usr/bin/env bash
# schemathesis (pinned, in .venv-api) against `agent-runs serve`, driven by
# the OpenAPI document the server serves: every operation, all checks
# (infra/schemathesis.toml), stateful sequences through the document's
# links; then again with an invalid key, where every request must get 401
# in the contract's error format; then with a key of scope runs:read only on
# the operations that need another scope, where every request of the
# operation's method must get 403 forbidden naming the scope (whatever its
# body: the scope is checked first, so the checks of accepted and rejected
# data do not apply there). Before those, a Python client generated from
# the served document with openapi-python-client (pinned, in
# .venv-openapi-client) must import and drive a run through create,
# approve and succeeded (infra/openapi_client_test.py; with
# OPENAPI_TS_CHECK=1 set, openapi-typescript's types are generated and
# type-checked too, through npx). Called by infra/test.sh after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv-api/bin/st ] || ! .venv-api/bin/pip freeze 2>/dev/null | grep -qxF "schemathesis==4.32.5"; then
  python3 -m venv .venv-api
  .venv-api/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-api.txt
fi
if [ ! -x .venv-openapi-client/bin/openapi-python-client ] || ! .venv-openapi-client/bin/pip freeze 2>/dev/null | grep -qxF "openapi-python-client==0.29.1"; then
  python3 -m venv .venv-openapi-client
  .venv-openapi-client/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-openapi-client.txt
fi

work=$(mktemp -d)
port=$(.venv-api/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
AGENT_RUNS_RATE_LIMIT_PER_SECOND=0 AGENT_RUNS_LOG=warn \
  target/debug/agent-runs serve --addr "127.0.0.1:$port" --db "$work/runs.db" > "$work/serve.out" 2> "$work/serve.err" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do grep -q "^Listening on" "$work/serve.out" && break; sleep 0.1; done
key=$(sed -n 's/^ *export AGENT_RUNS_KEY=//p' "$work/serve.out")
schema="http://127.0.0.1:$port/v1/openapi.json"

echo "== a client generated from the document (openapi-python-client): create -> approve -> succeeded"
# And, where Node is installed (Debian's nodejs), openapi-typescript's types
# of the same document must type-check a use of them with tsc (through npx).
ts_check=0
command -v npx > /dev/null && ts_check=1
OPENAPI_TS_CHECK=$ts_check AGENT_RUNS_URL="http://127.0.0.1:$port" AGENT_RUNS_KEY="$key" \
  .venv-openapi-client/bin/python infra/openapi_client_test.py

echo "== schemathesis: all phases (coverage, fuzzing, stateful), all checks, valid key"
.venv-api/bin/st --no-color --config-file infra/schemathesis.toml run "$schema" \
  -H "Authorization: Bearer $key" --max-examples 100 --seed 1 \
  --report har --report-har-path "$work/valid.har" > "$work/valid.log" 2>&1 || { cat "$work/valid.log"; exit 1; }
tail -n 12 "$work/valid.log"

echo "== schemathesis: the same operations with an invalid key"
.venv-api/bin/st --no-color --config-file infra/schemathesis.toml run "$schema" \
  -H "Authorization: Bearer ark_0000000000000000000000000000000000000000000" --max-examples 20 --seed 1 \
  --output-sanitize false --report har --report-har-path "$work/invalid.har" > "$work/invalid.log" 2>&1 || { cat "$work/invalid.log"; exit 1; }

echo "== schemathesis: a runs:read key on the operations that need more"
reader=$(target/debug/agent-runs keys create --owner dev --name reader --scope runs:read --db "$work/runs.db" | tr -d '[:space:]')
# The operations that need more than runs:read, as the document says.
scoped=$(.venv-api/bin/python - "$schema" <<'PY'
import json, sys, urllib.request
document = json.load(urllib.request.urlopen(sys.argv[1]))
print("|".join(
    spec["operationId"] for methods in document["paths"].values() for spec in methods.values()
    if any(scope != "runs:read" for need in spec.get("security", []) for scope in need.get("bearer", []))
))
PY
)
.venv-api/bin/st --no-color --config-file infra/schemathesis.toml run "$schema" \
  -H "Authorization: Bearer $reader" --max-examples 20 --seed 1 --phases examples,coverage,fuzzing \
  --exclude-checks positive_data_acceptance,negative_data_rejection --output-sanitize false \
  --include-operation-id-regex "^($scoped)\$" \
  --report har --report-har-path "$work/scoped.har" > "$work/scoped.log" 2>&1 || { cat "$work/scoped.log"; exit 1; }

.venv-api/bin/python - "$work/valid.har" "$work/invalid.har" "$work/scoped.har" "$reader" "$schema" <<'PY'
import collections, json, re, sys, urllib.parse, urllib.request

# The document and the receipt keys need no key: not judged as operations.
KEYLESS = {"/v1/openapi.json", "/.well-known/jwks.json"}

def entries(path):
    return [
        e for e in json.load(open(path))["log"]["entries"]
        if urllib.parse.urlsplit(e["request"]["url"]).path not in KEYLESS
    ]

valid = entries(sys.argv[1])
statuses = collections.Counter(e["response"]["status"] for e in valid)
assert valid and not any(status >= 500 for status in statuses), statuses
print(f"valid key: {len(valid)} requests, statuses {dict(sorted(statuses.items()))}, no 5xx")

invalid = entries(sys.argv[2])
for entry in invalid:
    response = entry["response"]
    headers = {h["name"].lower(): h["value"] for h in response["headers"]}
    body = json.loads(response["content"]["text"])
    what = f'{entry["request"]["method"]} {entry["request"]["url"]}'
    assert response["status"] == 401, what
    assert headers.get("content-type") == "application/json", what
    assert headers.get("www-authenticate") == "Bearer", what
    assert body["error"]["code"] == "unauthorized" and body["error"]["message"], what
methods = collections.Counter(e["request"]["method"] for e in invalid)
print(f"invalid key: all {len(invalid)} requests answered 401 unauthorized in the error format ({dict(methods)})")

# The operations a runs:read key may not use, by method and path, and the
# scope each needs, as the document says.
document = json.load(urllib.request.urlopen(sys.argv[5]))
needs = [
    (method.upper(), re.sub(r"\{[^}]+\}", "[^/]+", path), scope)
    for path, methods in document["paths"].items() for method, spec in methods.items()
    for need in spec.get("security", []) for scope in need.get("bearer", []) if scope != "runs:read"
]
assert needs, "the document names the scope of each operation"
checked = 0
for entry in entries(sys.argv[3]):
    sent = {h["name"].lower(): h["value"] for h in entry["request"]["headers"]}
    if sent.get("authorization") != f"Bearer {sys.argv[4]}":
        continue  # the checks of authentication itself send none or another
    method, path = entry["request"]["method"], entry["request"]["url"].split("?")[0].split("://", 1)[1].split("/", 1)[1]
    scope = next((scope for m, p, scope in needs if m == method and re.fullmatch(p, "/" + path)), None)
    if scope is None:
        continue  # another method on the path: 405 before any scope
    response = entry["response"]
    body = json.loads(response["content"]["text"])
    what = f"{method} /{path}"
    assert response["status"] == 403, (what, response["status"], body)
    assert body["error"]["code"] == "forbidden" and scope in body["error"]["message"], (what, body)
    checked += 1
assert checked, "no request of a scoped operation was made"
print(f"runs:read key: all {checked} requests to operations needing another scope answered 403 forbidden naming it")
PY
