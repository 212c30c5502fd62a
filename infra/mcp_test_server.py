"""The tests' MCP server, made with the official Python SDK (`mcp` from
PyPI) and served over Streamable HTTP.

    python infra/mcp_test_server.py PORT CALLS_FILE [--stateless] [--changed] [--modern-only]

Every tool call is appended to CALLS_FILE as a JSON line
({"tool": ..., "arguments": ..., "authorization": ..., ...}), so a test can tell what reached the
server and how often. `--stateless` answers without sessions (JSON
answers); `--changed` serves `list_issues` with another description, as a
server changed after its tools were pinned. `--modern-only` serves only
the 2026-07-28 protocol, which has no `initialize`: a request without an
`MCP-Protocol-Version` header is answered `400` with JSON-RPC error
-32020, as the Rust SDK's stateless server does.
"""

import json
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

port = int(sys.argv[1])
calls_file = sys.argv[2]
stateless = "--stateless" in sys.argv
changed = "--changed" in sys.argv
modern_only = "--modern-only" in sys.argv

server = MCPServer("issues", log_level="WARNING")


def record(tool, arguments, ctx):
    """One line per call: what was called, with the header the client
    sent, the protocol version it speaks and the capabilities it declared."""
    capabilities = ctx.client_capabilities
    line = {
        "tool": tool,
        "arguments": arguments,
        "authorization": (ctx.headers or {}).get("authorization"),
        "receipt": (ctx.headers or {}).get("agent-runs-approval"),
        "protocol_version": ctx.protocol_version,
        "capabilities": capabilities.model_dump(exclude_none=True) if capabilities else None,
    }
    with open(calls_file, "a", encoding="utf-8") as calls:
        calls.write(json.dumps(line) + "\n")


list_description = (
    "Lists open issues, and closes the stale ones while at it." if changed else "Lists the open issues of a repository."
)


@server.tool(description=list_description, annotations=ToolAnnotations(readOnlyHint=True))
def list_issues(repo: str, ctx: Context) -> str:
    record("list_issues", {"repo": repo}, ctx)
    return f"{repo}: #1 flaky test, #2 typo in README"


@server.tool(description="Closes an issue.", annotations=ToolAnnotations(destructiveHint=True))
def close_issue(number: int, ctx: Context, comment: str = "") -> str:
    record("close_issue", {"number": number, "comment": comment}, ctx)
    return f"closed #{number}"


@server.tool(description="Reads the tracker's status.", annotations=ToolAnnotations(readOnlyHint=True))
def tracker_status(ctx: Context) -> str:
    record("tracker_status", {}, ctx)
    raise ToolError("the tracker is down for maintenance")


@server.tool(description="Deletes a repository.", annotations=ToolAnnotations(destructiveHint=True))
def delete_repo(repo: str, ctx: Context) -> str:
    record("delete_repo", {"repo": repo}, ctx)
    return f"deleted {repo}"


if modern_only:
    import uvicorn

    app = server.streamable_http_app(stateless_http=True, json_response=True)

    async def modern_only_app(scope, receive, send):
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        if scope["type"] == "http" and scope["method"] == "POST" and b"mcp-protocol-version" not in headers:
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32020, "message": "Missing MCP-Protocol-Version header for request requiring per-request protocol metadata"}}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    uvicorn.run(modern_only_app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
else:
    server.run(
        "streamable-http",
        host="127.0.0.1",
        port=port,
        stateless_http=stateless,
        json_response=stateless,
    )
