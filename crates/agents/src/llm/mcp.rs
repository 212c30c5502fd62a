//! MCP servers as tools: the official SDK's client (`rmcp`) over
//! Streamable HTTP, on the tools' own HTTP client, so the same address
//! checks hold and no redirect is followed (the transport's own included).
//! A step connects to the servers it needs and closes the sessions when it
//! ends: listing the tools each model turn is what lets a tool changed on
//! its server be noticed before the model is offered it again.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ContentBlock, Implementation, PaginatedRequestParams,
    ProtocolVersion, ResourceContents,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;

use super::tools::{EnvLookup, McpBinding, Tool, ToolHttp, ToolOutcome, refused_as_not_public};
use crate::public_network;
use agent_runs_domain::{
    MAX_MCP_RESULT_BYTES, McpServerDefinition, ToolDefinition, ToolMethod, tool_pin, valid_agent_name,
};

/// The largest answer read from a server (a page of tools or a result).
const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// A listing stops there: a server cannot keep a step paging.
const MAX_TOOL_PAGES: usize = 10;
const MAX_TOOLS: usize = 500;
/// What of a JSON-RPC error's message the model is told.
const MAX_ERROR_CHARS: usize = 1_000;

/// Why a server on a private address is not used.
const NOT_PUBLIC: &str = "its address is a private or local network address, which tools may not reach.";

/// A server could not be used: the run fails with this, naming the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable(pub String);

/// A tool listed by a server, with its pin.
#[derive(Debug, Clone)]
pub struct ListedTool {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Value,
    pub read_only: bool,
    pub pin: String,
}

/// An open session with one server.
pub struct McpSession {
    service: RunningService<RoleClient, ClientConfig>,
    server: String,
    timeout: Duration,
}

fn unreachable(server: &McpServerDefinition, why: &str) -> Unreachable {
    Unreachable(format!("The MCP server `{}` could not be used: {why}", server.name))
}

fn client_info() -> ClientConfig {
    // No sampling, no elicitation, no roots: the server may ask nothing of us.
    // The handshake names the newest version that has one (the SDK's
    // newest, a draft, has none).
    ClientConfig::new(ClientCapabilities::default(), Implementation::new("agent-runs", env!("CARGO_PKG_VERSION")))
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

/// Whether a failed `initialize` was refused by a server of the protocol
/// without one: it answers the JSON-RPC error -32020 (a header it needs on
/// every request, `MCP-Protocol-Version`, is missing).
fn has_no_handshake(chain: &str) -> bool {
    chain.contains("-32020") || chain.contains("MCP-Protocol-Version")
}

/// Why a request failed, in words for the run (the cause goes to the log).
fn describe(error: &(dyn std::error::Error + 'static), timeout: Duration) -> String {
    if refused_as_not_public(error) {
        return NOT_PUBLIC.into();
    }
    let chain = agent_runs_ports::error_chain(error);
    if chain.contains("timed out") || chain.contains("timeout") {
        return format!("it did not answer within {} ms.", timeout.as_millis());
    }
    if chain.contains("Auth required") || chain.contains("HTTP 401") {
        return "it refused our credentials (HTTP 401): check the header values its `headers_from_env` names.".into();
    }
    if chain.contains("Insufficient scope") || chain.contains("HTTP 403") {
        return "it refused access (HTTP 403): the credentials its `headers_from_env` names may not use it.".into();
    }
    // `HTTP 400 Bad Request: ...`, as the SDK words a status it cannot use.
    if let Some(at) = chain.find("HTTP 4").or_else(|| chain.find("HTTP 5")) {
        let status: String = chain[at + 5..].chars().take_while(char::is_ascii_digit).collect();
        if status.len() == 3 {
            return format!("it answered the MCP handshake with HTTP {status}.");
        }
    }
    "it could not be reached, or it did not complete the MCP handshake.".into()
}

impl McpSession {
    /// Connects and completes the handshake (the protocol version is
    /// negotiated; sessions are kept when the server keeps them).
    pub async fn open(
        server: &McpServerDefinition,
        http: &ToolHttp,
        env: &EnvLookup,
        receipt: Option<&str>,
    ) -> Result<Self, Unreachable> {
        let timeout = Duration::from_millis(server.timeout_ms);
        // One deadline for the handshake and, should it fail, the address check.
        let deadline = tokio::time::Instant::now() + timeout;
        if http.public_only && public_network::check_url(&server.url).is_err() {
            return Err(unreachable(server, NOT_PUBLIC));
        }
        let mut headers = HashMap::new();
        for (header, variable) in &server.headers_from_env {
            let value = env(variable).ok_or_else(|| {
                tracing::error!(server = %server.name, %variable, "an MCP server header's environment variable is not set");
                unreachable(server, "it is not configured on this deployment (a header's environment variable is not set).")
            })?;
            let (Ok(name), Ok(value)) =
                (http::HeaderName::try_from(header.as_str()), http::HeaderValue::try_from(value))
            else {
                return Err(unreachable(server, "a header's value is not a valid HTTP header value."));
            };
            headers.insert(name, value);
        }
        if let Some(receipt) = receipt {
            let receipt = http::HeaderValue::try_from(receipt)
                .map_err(|_| unreachable(server, "the call's approval receipt could not be sent."))?;
            headers.insert(http::HeaderName::from_static("agent-runs-approval"), receipt);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(server.url.as_str())
            .custom_headers(headers)
            .max_json_response_size(MAX_MESSAGE_BYTES)
            .max_sse_event_size(MAX_MESSAGE_BYTES)
            // A call is sent once: no new session and a second POST after a
            // `404` (the server may have run it).
            .reinit_on_expired_session(false)
            .control_request_timeout(timeout)
            .session_recovery_timeout(timeout);
        // The handshake changes nothing on the server, so it is tried a
        // second time (within the same time): the first may have gone out
        // on a pooled connection the server had closed (it restarted). A
        // server that has no handshake (the 2026-07-28 protocol: it wants
        // the version on every request) is discovered instead.
        let handshake = async {
            let transport = StreamableHttpClientTransport::with_client(http.client.clone(), config.clone());
            match client_info().serve(transport).await {
                Ok(service) => Ok(service),
                Err(error) => {
                    let chain = agent_runs_ports::error_chain(&error);
                    tracing::info!(server = %server.name, error = %chain, "MCP handshake failed; trying again");
                    let transport = StreamableHttpClientTransport::with_client(http.client.clone(), config);
                    if has_no_handshake(&chain) {
                        let discover =
                            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
                        client_info().serve_with_lifecycle(transport, discover).await
                    } else {
                        client_info().serve(transport).await
                    }
                }
            }
        };
        match tokio::time::timeout_at(deadline, handshake).await {
            Ok(Ok(service)) => Ok(McpSession { service, server: server.name.clone(), timeout }),
            Ok(Err(error)) => {
                tracing::warn!(server = %server.name, error = %agent_runs_ports::error_chain(&error), "MCP handshake failed");
                // The SDK's error does not carry the resolver's reason: a
                // name that resolves to private addresses only is told so.
                let private = http.public_only
                    && tokio::time::timeout_at(deadline, public_network::resolves_only_to_private(&server.url))
                        .await
                        .unwrap_or(false);
                let why = if private { NOT_PUBLIC.to_owned() } else { describe(&error, timeout) };
                Err(unreachable(server, &why))
            }
            Err(_) => Err(unreachable(server, &format!("it did not answer within {} ms.", timeout.as_millis()))),
        }
    }

    /// Every tool the server lists (at most 10 pages and 500 tools), with
    /// its pin. Two tools of one name are both left out: neither can be
    /// told from the other.
    pub async fn list(&self) -> Result<Vec<ListedTool>, Unreachable> {
        let failed = |why: String| Unreachable(format!("The MCP server `{}` could not be used: {why}", self.server));
        let listing = async {
            let mut tools = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_TOOL_PAGES {
                let page = PaginatedRequestParams::default().with_cursor(cursor.take());
                let page = self.service.peer().list_tools(Some(page)).await?;
                tools.extend(page.tools);
                match page.next_cursor {
                    Some(next) if tools.len() < MAX_TOOLS => cursor = Some(next),
                    _ => break,
                }
            }
            tools.truncate(MAX_TOOLS);
            Ok::<_, rmcp::ServiceError>(tools)
        };
        let tools = match tokio::time::timeout(self.timeout, listing).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(error)) => {
                tracing::warn!(server = %self.server, error = %agent_runs_ports::error_chain(&error), "MCP tools/list failed");
                return Err(failed("it did not list its tools.".into()));
            }
            Err(_) => return Err(failed(format!("it did not list its tools within {} ms.", self.timeout.as_millis()))),
        };
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        for tool in &tools {
            *seen.entry(tool.name.to_string()).or_default() += 1;
        }
        Ok(tools
            .into_iter()
            .filter(|tool| {
                let once = seen[tool.name.as_ref()] == 1;
                if !once {
                    tracing::warn!(server = %self.server, tool = %tool.name, "an MCP server lists two tools of one name; neither is offered");
                }
                once
            })
            .map(|tool| {
                let input_schema = Value::Object((*tool.input_schema).clone());
                let annotations = tool.annotations.as_ref().and_then(|a| serde_json::to_value(a).ok());
                let read_only = tool.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true);
                let description = tool.description.as_deref().map(str::to_owned);
                let pin = tool_pin(&tool.name, description.as_deref(), &input_schema, annotations.as_ref());
                ListedTool { name: tool.name.into_owned(), description, input_schema, read_only, pin }
            })
            .collect())
    }

    /// Calls the tool once with `arguments`; what it returns, or why it
    /// failed, goes to the model.
    pub async fn call(&self, tool: &str, arguments: &Value) -> ToolOutcome {
        let Value::Object(arguments) = arguments else {
            return ToolOutcome::error("The arguments must be a JSON object.");
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
        let result = match tokio::time::timeout(self.timeout, self.service.peer().call_tool(params)).await {
            Ok(Ok(result)) => result,
            Ok(Err(rmcp::ServiceError::McpError(error))) => {
                let message: String = error.message.chars().take(MAX_ERROR_CHARS).collect();
                return ToolOutcome::error(format!("The tool call failed: {message}"));
            }
            Ok(Err(error)) => {
                tracing::warn!(server = %self.server, %tool, error = %agent_runs_ports::error_chain(&error), "MCP tools/call failed");
                return ToolOutcome::error("The tool's server did not answer the call.");
            }
            Err(_) => {
                return ToolOutcome::error(format!("The tool did not answer within {} ms.", self.timeout.as_millis()));
            }
        };
        let mut parts: Vec<String> = result
            .content
            .iter()
            .map(|content| match content {
                ContentBlock::Text(text) => text.text.clone(),
                ContentBlock::Image(image) => {
                    format!("[image, {}, {} bytes as base64]", image.mime_type, image.data.len())
                }
                ContentBlock::Audio(audio) => {
                    format!("[audio, {}, {} bytes as base64]", audio.mime_type, audio.data.len())
                }
                ContentBlock::Resource(resource) => match &resource.resource {
                    ResourceContents::TextResourceContents { uri, text, .. } => format!("[resource {uri}]\n{text}"),
                    ResourceContents::BlobResourceContents { uri, .. } => format!("[resource {uri}, binary]"),
                    _ => "[a resource of a kind this client does not read]".to_owned(),
                },
                ContentBlock::ResourceLink(link) => format!("[resource link {}]", link.uri),
                _ => "[content of a kind this client does not read]".to_owned(),
            })
            .collect();
        if parts.is_empty()
            && let Some(structured) = &result.structured_content
        {
            parts.push(structured.to_string());
        }
        let mut content = parts.join("\n");
        if content.len() > MAX_MCP_RESULT_BYTES {
            let mut end = MAX_MCP_RESULT_BYTES;
            while !content.is_char_boundary(end) {
                end -= 1;
            }
            content.truncate(end);
            content.push_str(&format!("\n[the result was cut at {MAX_MCP_RESULT_BYTES} bytes]"));
        }
        if result.is_error == Some(true) {
            return ToolOutcome::error(format!("The tool reported an error: {content}"));
        }
        ToolOutcome { content, is_error: false, http_status: None }
    }

    /// Ends the session (a server that keeps sessions is told).
    pub async fn close(mut self) {
        let _ = self.service.close_with_timeout(Duration::from_secs(2)).await;
    }
}

/// Connects to `server`, lists its tools and pins each (`agents put`;
/// again, to re-pin): what it listed.
pub async fn pin(
    server: &mut McpServerDefinition,
    http: &ToolHttp,
    env: &EnvLookup,
) -> Result<Vec<ListedTool>, Unreachable> {
    let session = McpSession::open(server, http, env, None).await?;
    let listed = session.list().await;
    session.close().await;
    let listed = listed?;
    server.pinned = listed.iter().map(|tool| (tool.name.clone(), tool.pin.clone())).collect();
    Ok(listed)
}

/// The tools of `server` its allow-list offers the model, given what it
/// lists now, as tools of the definition. A tool whose full name no model
/// accepts, or whose schema cannot be compiled, is left out.
pub fn offered(server: &McpServerDefinition, listed: Vec<ListedTool>) -> Vec<Tool> {
    listed
        .into_iter()
        .filter(|tool| server.offers(&tool.name))
        .filter_map(|tool| {
            let name = server.tool_name(&tool.name);
            if !valid_agent_name(&name) {
                tracing::warn!(server = %server.name, tool = %tool.name, "an MCP tool's name is not one models accept; it is not offered");
                return None;
            }
            let changed = server.changed(&tool.name, &tool.pin);
            let definition = ToolDefinition {
                name,
                description: tool.description.clone().unwrap_or_else(|| tool.name.clone()),
                parameters: tool.input_schema,
                method: ToolMethod::Post,
                url: server.url.clone(),
                headers_from_env: server.headers_from_env.clone(),
                timeout_ms: server.timeout_ms,
                max_response_bytes: MAX_MCP_RESULT_BYTES,
                requires_approval: changed || server.require_approval.requires_approval(tool.read_only),
                always_ask: changed,
                auto_approve_after_secs: None,
            };
            let binding = McpBinding { server: server.name.clone(), tool: tool.name.clone(), pin: tool.pin, changed };
            match Tool::listed(definition, binding) {
                Ok(offered) => Some(offered),
                Err(error) => {
                    tracing::warn!(server = %server.name, tool = %tool.name, %error, "an MCP tool's input schema does not compile; it is not offered");
                    None
                }
            }
        })
        .collect()
}
