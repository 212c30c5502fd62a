//! Agent definitions: operator-managed agents backed by a language model
//! that calls HTTP tools. A definition is data; `AgentDefinition::parse`
//! checks everything that can be checked before the first run.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::mcp::{MAX_MCP_SERVER_NAME_CHARS, McpServerDefinition, valid_mcp_server_name};
use crate::run_values::Budget;
use crate::schema::compile_schema;

pub const MAX_AGENT_NAME_CHARS: usize = 64;
pub const MAX_AGENT_STEPS: u32 = 100;
pub const MAX_TOOL_TIMEOUT_MS: u64 = 120_000;
pub const MAX_TOOL_RESPONSE_BYTES: usize = 1_048_576;
/// Names the built-in agents take; a definition may not shadow them.
pub const BUILTIN_AGENT_NAMES: [&str; 2] = ["echo", "script"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Amazon Bedrock's Converse API, with the process's AWS credentials.
    Bedrock,
    /// Any endpoint that speaks OpenAI's chat-completions protocol.
    Openai,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ToolMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl ToolMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolMethod::Get => "GET",
            ToolMethod::Post => "POST",
            ToolMethod::Put => "PUT",
            ToolMethod::Patch => "PATCH",
            ToolMethod::Delete => "DELETE",
        }
    }

    /// Whether the arguments travel as a JSON body (else as the query string).
    pub fn has_body(self) -> bool {
        matches!(self, ToolMethod::Post | ToolMethod::Put | ToolMethod::Patch)
    }
}

fn default_max_steps() -> u32 {
    10
}

fn default_timeout_ms() -> u64 {
    10_000
}

fn default_max_response_bytes() -> usize {
    65_536
}

fn default_parameters() -> serde_json::Value {
    serde_json::json!({"type": "object"})
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinition {
    /// What the model calls it: 1 to 64 of `a-z A-Z 0-9 _ -`.
    pub name: String,
    pub description: String,
    /// The JSON Schema the arguments must match; an object schema.
    #[serde(default = "default_parameters")]
    pub parameters: serde_json::Value,
    pub method: ToolMethod,
    /// `http://` or `https://`.
    pub url: String,
    /// Header name to the name of the environment variable holding its value,
    /// so secrets stay out of the definition and the store.
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
    /// A call waits for a human to approve it.
    #[serde(default)]
    pub requires_approval: bool,
    /// A person decides every call, whatever the owner's policy allows (a
    /// rule may still deny).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always_ask: bool,
    /// A veto window: a call waiting for a person is approved (as
    /// `timeout`) this many seconds after it is asked unless someone
    /// decides first. Only with `requires_approval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approve_after_secs: Option<u64>,
}

/// The shortest and the longest veto window.
pub const AUTO_APPROVE_AFTER_SECS: std::ops::RangeInclusive<u64> = 60..=86_400;

impl ToolDefinition {
    /// Its veto window, if it has one.
    pub fn auto_approve_after(&self) -> Option<std::time::Duration> {
        self.auto_approve_after_secs.map(std::time::Duration::from_secs)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub provider: ProviderKind,
    /// The provider's model id (a Bedrock model or inference profile id).
    pub model: String,
    /// OpenAI-compatible providers: the API's base URL, up to `/v1`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// OpenAI-compatible providers: the environment variable with the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    pub system_prompt: String,
    /// Model calls a run may make before it fails.
    #[serde(default = "default_max_steps")]
    pub max_steps: u32,
    /// The most tokens one model reply may have; the provider's default when absent.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub tools: Vec<ToolDefinition>,
    /// Lets the tools reach loopback, private and link-local addresses
    /// (127.0.0.1, 10.0.0.0/8, 169.254.169.254 ...), which are refused
    /// otherwise. Only for tools that really run on a private network: the
    /// model chooses the arguments, so a prompt-injected call could then
    /// reach anything that network serves. Left out of the stored
    /// definition when false, so a definition without it reads as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_network: bool,
    /// The key that created a run may not decide its approvals (a second
    /// person must). Left out of the stored definition when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub separate_approver: bool,
    /// Tokens (input and output, as the provider counts them) a run may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<u64>,
    /// Tool calls a run may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Offers the model a tool `ask_human` that puts a question to a
    /// person and waits for the answer. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ask_human: bool,
    /// Remote MCP servers whose tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServerDefinition>,
}

/// The tool a definition with `ask_human` offers its model.
pub const ASK_HUMAN_TOOL: &str = "ask_human";

impl AgentDefinition {
    /// The budget every run of this agent has at most.
    pub fn budget(&self) -> Budget {
        Budget { max_total_tokens: self.max_total_tokens, max_tool_calls: self.max_tool_calls }
    }

    /// The MCP server a tool name of the model's belongs to, and the
    /// tool's name there (the definition's checks make it at most one).
    pub fn mcp_tool<'n>(&self, name: &'n str) -> Option<(&McpServerDefinition, &'n str)> {
        self.mcp_servers.iter().find_map(|server| {
            let tool = name.strip_prefix(&server.tool_name(""))?;
            (!tool.is_empty()).then_some((server, tool))
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DefinitionError(pub String);

pub fn valid_agent_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_AGENT_NAME_CHARS
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

fn valid_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() <= 2_048
        && !url.contains(char::is_whitespace)
}

/// Environment variables a definition may read: never the AWS credentials
/// or the service's own settings.
fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_')
        && !name.starts_with("AWS_")
        && !name.starts_with("AGENT_RUNS_")
}

impl AgentDefinition {
    /// Checks a definition as an operator wrote it.
    pub fn parse(self) -> Result<Self, DefinitionError> {
        let fail = |message: String| Err(DefinitionError(message));
        if !valid_agent_name(&self.name) {
            return fail(format!(
                "`name` must be 1 to {MAX_AGENT_NAME_CHARS} letters, digits, `_` or `-`; got {:?}.",
                self.name
            ));
        }
        if BUILTIN_AGENT_NAMES.contains(&self.name.as_str()) {
            return fail(format!("`{}` is a built-in agent; choose another name.", self.name));
        }
        if self.model.trim().is_empty() {
            return fail("`model` must name the provider's model.".into());
        }
        if self.system_prompt.trim().is_empty() {
            return fail("`system_prompt` must not be empty.".into());
        }
        if !(1..=MAX_AGENT_STEPS).contains(&self.max_steps) {
            return fail(format!("`max_steps` must be 1 to {MAX_AGENT_STEPS}."));
        }
        if self.max_total_tokens == Some(0) {
            return fail("`max_total_tokens` must be at least 1 (leave it out for no limit).".into());
        }
        if self.provider == ProviderKind::Bedrock && (self.base_url.is_some() || self.api_key_env.is_some()) {
            return fail(
                "`base_url` and `api_key_env` are for OpenAI-compatible providers; Bedrock uses the AWS endpoint and credentials."
                    .into(),
            );
        }
        if let Some(url) = &self.base_url
            && !valid_url(url)
        {
            return fail("`base_url` must be an http:// or https:// URL.".into());
        }
        if let Some(env) = &self.api_key_env
            && !valid_env_name(env)
        {
            return fail(format!("`api_key_env` {env:?} is not an allowed environment variable name."));
        }
        let mut seen = BTreeSet::new();
        for tool in &self.tools {
            let label = format!("tool `{}`", tool.name);
            if !valid_agent_name(&tool.name) {
                return fail(format!(
                    "A tool's `name` must be 1 to 64 letters, digits, `_` or `-`; got {:?}.",
                    tool.name
                ));
            }
            if !seen.insert(tool.name.as_str()) {
                return fail(format!("Two tools are named `{}`.", tool.name));
            }
            if self.ask_human && tool.name == ASK_HUMAN_TOOL {
                return fail(format!(
                    "A tool may not be named `{ASK_HUMAN_TOOL}` when `ask_human` is true: it is that tool."
                ));
            }
            if tool.description.trim().is_empty() {
                return fail(format!("{label}: `description` must not be empty; the model reads it."));
            }
            if !valid_url(&tool.url) {
                return fail(format!("{label}: `url` must be an http:// or https:// URL."));
            }
            if tool.parameters.get("type").and_then(|kind| kind.as_str()) != Some("object") {
                return fail(format!("{label}: `parameters` must be a JSON Schema with \"type\": \"object\"."));
            }
            if let Err(error) = compile_schema(&tool.parameters) {
                return fail(format!("{label}: `parameters` is not a valid JSON Schema: {error}"));
            }
            if !(1..=MAX_TOOL_TIMEOUT_MS).contains(&tool.timeout_ms) {
                return fail(format!("{label}: `timeout_ms` must be 1 to {MAX_TOOL_TIMEOUT_MS}."));
            }
            if !(1..=MAX_TOOL_RESPONSE_BYTES).contains(&tool.max_response_bytes) {
                return fail(format!("{label}: `max_response_bytes` must be 1 to {MAX_TOOL_RESPONSE_BYTES}."));
            }
            check_headers(&label, &tool.headers_from_env)?;
            if let Some(secs) = tool.auto_approve_after_secs {
                if !AUTO_APPROVE_AFTER_SECS.contains(&secs) {
                    return fail(format!(
                        "{label}: `auto_approve_after_secs` must be {} to {} seconds.",
                        AUTO_APPROVE_AFTER_SECS.start(),
                        AUTO_APPROVE_AFTER_SECS.end()
                    ));
                }
                if !tool.requires_approval {
                    return fail(format!(
                        "{label}: `auto_approve_after_secs` needs `requires_approval = true` (a veto window is for calls a person is asked about)."
                    ));
                }
                if self.separate_approver {
                    return fail(format!(
                        "{label}: `auto_approve_after_secs` cannot be used with `separate_approver = true`: a second person must decide, so nobody's silence may."
                    ));
                }
                if tool.always_ask {
                    return fail(format!(
                        "{label}: `auto_approve_after_secs` cannot be used with `always_ask = true`: a person must decide, so nobody's silence may."
                    ));
                }
            }
        }
        check_servers(&self.mcp_servers, &seen, self.allow_private_network)?;
        Ok(self)
    }
}

/// Header names, and the environment variables their values come from.
fn check_headers(label: &str, headers: &BTreeMap<String, String>) -> Result<(), DefinitionError> {
    for (header, env) in headers {
        if http_header_name_invalid(header) {
            return Err(DefinitionError(format!("{label}: {header:?} is not a valid header name.")));
        }
        // The service's own: a receipt, and the key a repeat is known by.
        if ["agent-runs-approval", "idempotency-key"].contains(&header.to_ascii_lowercase().as_str()) {
            return Err(DefinitionError(format!("{label}: {header:?} is set by the service itself.")));
        }
        if !valid_env_name(env) {
            return Err(DefinitionError(format!("{label}: {env:?} is not an allowed environment variable name.")));
        }
    }
    Ok(())
}

/// Checks the servers of a definition whose HTTP tools are `tool_names`.
fn check_servers(
    servers: &[McpServerDefinition],
    tool_names: &BTreeSet<&str>,
    allow_private_network: bool,
) -> Result<(), DefinitionError> {
    let fail = |message: String| Err(DefinitionError(message));
    let mut seen = BTreeSet::new();
    for (index, server) in servers.iter().enumerate() {
        let field = |name: &str| format!("mcp_servers[{index}].{name}");
        if !valid_mcp_server_name(&server.name) {
            return fail(format!(
                "`{}` must be 1 to {MAX_MCP_SERVER_NAME_CHARS} of a-z, 0-9, `_` or `-`; got {:?}.",
                field("name"),
                server.name
            ));
        }
        if !seen.insert(server.name.as_str()) {
            return fail(format!("`{}`: two MCP servers are named `{}`.", field("name"), server.name));
        }
        let prefix = server.tool_name("");
        // `a` and `a__b` would both claim `a__b__c`; `a` and `a_`, `a___c`.
        let claims_ours =
            |other: &McpServerDefinition| other.name == format!("{}_", server.name) || other.name.starts_with(&prefix);
        if let Some(other) = servers.iter().find(|other| other.name != server.name && claims_ours(other)) {
            return fail(format!(
                "`{}`: the MCP servers `{}` and `{}` would both claim tools named `{}<tool>`.",
                field("name"),
                server.name,
                other.name,
                other.tool_name("")
            ));
        }
        if let Some(clash) = tool_names.iter().find(|tool| tool.starts_with(&prefix)) {
            return fail(format!(
                "`{}`: the tool `{clash}` would clash with the MCP server `{}`'s tools, named `{prefix}<tool>`.",
                field("name"),
                server.name
            ));
        }
        if !valid_url(&server.url) {
            return fail(format!("`{}` must be an https:// URL.", field("url")));
        }
        if server.url.starts_with("http://") && !allow_private_network {
            return fail(format!(
                "`{}` must be an https:// URL (http:// only with `allow_private_network = true`).",
                field("url")
            ));
        }
        if !(1..=MAX_TOOL_TIMEOUT_MS).contains(&server.timeout_ms) {
            return fail(format!("`{}` must be 1 to {MAX_TOOL_TIMEOUT_MS}.", field("timeout_ms")));
        }
        if let Some(tools) = &server.tools {
            let mut listed = BTreeSet::new();
            for tool in tools {
                if tool.is_empty() || tool.len() > 128 {
                    return fail(format!("`{}` lists an empty or over-long tool name.", field("tools")));
                }
                if !listed.insert(tool.as_str()) {
                    return fail(format!("`{}` lists `{tool}` twice.", field("tools")));
                }
            }
        }
        if let Some(header) = server.headers_from_env.keys().find(|header| {
            ["accept", "content-type", "mcp-session-id", "mcp-protocol-version", "last-event-id"]
                .contains(&header.to_ascii_lowercase().as_str())
        }) {
            return fail(format!("`{}`: the MCP transport sets `{header}` itself.", field("headers_from_env")));
        }
        check_headers(&field("headers_from_env"), &server.headers_from_env)?;
    }
    Ok(())
}

fn http_header_name_invalid(name: &str) -> bool {
    name.is_empty() || !name.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn definition() -> serde_json::Value {
        serde_json::json!({
            "name": "triage",
            "provider": "openai",
            "model": "gpt-test",
            "system_prompt": "You triage.",
            "max_steps": 10,
            "api_key_env": null,
            "tools": [{
                "name": "lookup",
                "description": "Looks a ticket up.",
                "method": "GET",
                "url": "http://127.0.0.1:1/lookup",
                "headers_from_env": {},
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
            }]
        })
    }

    fn parse(value: serde_json::Value) -> Result<AgentDefinition, String> {
        serde_json::from_value::<AgentDefinition>(value).map_err(|error| error.to_string())?.parse().map_err(|e| e.0)
    }

    #[test]
    fn accepts_a_full_definition_with_defaults() {
        let agent = parse(definition()).unwrap();
        assert_eq!(agent.max_steps, 10);
        assert_eq!(agent.tools[0].timeout_ms, 10_000);
        assert!(!agent.tools[0].requires_approval);
        assert!(!agent.allow_private_network);
    }

    #[test]
    fn private_networks_are_allowed_only_when_asked_for_and_stored_only_then() {
        let agent = parse(definition()).unwrap();
        assert!(serde_json::to_value(&agent).unwrap().get("allow_private_network").is_none());
        let mut document = definition();
        document["allow_private_network"] = serde_json::json!(true);
        let agent = parse(document).unwrap();
        assert!(agent.allow_private_network);
        let stored = serde_json::to_value(&agent).unwrap();
        assert_eq!(stored["allow_private_network"], true);
        assert_eq!(serde_json::from_value::<AgentDefinition>(stored).unwrap(), agent);
        let mut document = definition();
        document["allow_private_network"] = serde_json::json!("yes");
        assert!(parse(document).is_err());
    }

    #[test]
    fn refuses_what_cannot_work() {
        let cases: [(&str, serde_json::Value, &str); 8] = [
            ("/name", serde_json::json!("echo"), "built-in"),
            ("/name", serde_json::json!("has space"), "`name`"),
            ("/max_steps", serde_json::json!(0), "max_steps"),
            ("/api_key_env", serde_json::json!("AWS_SECRET_ACCESS_KEY"), "not an allowed"),
            ("/tools/0/url", serde_json::json!("file:///etc/passwd"), "`url`"),
            ("/tools/0/parameters", serde_json::json!({"type": "string"}), "\"type\": \"object\""),
            (
                "/tools/0/parameters",
                serde_json::json!({"type": "object", "minProperties": "x"}),
                "not a valid JSON Schema",
            ),
            ("/tools/0/headers_from_env", serde_json::json!({"Authorization": "AGENT_RUNS_TABLE"}), "not an allowed"),
        ];
        for (pointer, value, expected) in cases {
            let mut document = definition();
            *document.pointer_mut(pointer).unwrap_or_else(|| panic!("{pointer}")) = value;
            let error = parse(document).unwrap_err();
            assert!(error.contains(expected), "{pointer}: {error}");
        }
        for (secs, requires_approval, expected) in
            [(59, true, "60 to 86400"), (86_401, true, "60 to 86400"), (900, false, "requires_approval")]
        {
            let mut document = definition();
            document["tools"][0]["auto_approve_after_secs"] = serde_json::json!(secs);
            document["tools"][0]["requires_approval"] = serde_json::json!(requires_approval);
            let error = parse(document).unwrap_err();
            assert!(error.contains("auto_approve_after_secs") && error.contains(expected), "{error}");
        }
        let mut document = definition();
        document["tools"][0]["auto_approve_after_secs"] = serde_json::json!(900);
        document["tools"][0]["requires_approval"] = serde_json::json!(true);
        document["tools"][0]["always_ask"] = serde_json::json!(true);
        assert!(parse(document).unwrap_err().contains("`always_ask = true`: a person must decide"));
        let mut document = definition();
        document["tools"][0]["auto_approve_after_secs"] = serde_json::json!(900);
        document["tools"][0]["requires_approval"] = serde_json::json!(true);
        assert_eq!(parse(document).unwrap().tools[0].auto_approve_after(), Some(std::time::Duration::from_secs(900)));
        let mut document = definition();
        document["surprise"] = serde_json::json!(1);
        assert!(parse(document).unwrap_err().contains("surprise"));
    }

    #[test]
    fn mcp_servers_are_checked_and_named_in_the_message() {
        let server = serde_json::json!({"name": "github", "url": "https://mcp.example.com/mcp"});
        let mut document = definition();
        document["mcp_servers"] = serde_json::json!([server]);
        let agent = parse(document).unwrap();
        assert_eq!(agent.mcp_servers[0].require_approval, crate::mcp::McpApproval::UnlessReadOnly);
        assert_eq!(agent.mcp_servers[0].timeout_ms, 30_000);
        let cases: [(serde_json::Value, &str); 12] = [
            (serde_json::json!([{"name": "Git Hub", "url": "https://x.example/mcp"}]), "mcp_servers[0].name"),
            (serde_json::json!([server, server]), "two MCP servers are named `github`"),
            (serde_json::json!([{"name": "lookup", "url": "https://x.example/mcp"}]), "ok"),
            (serde_json::json!([{"name": "gh", "url": "http://x.example/mcp"}]), "mcp_servers[0].url"),
            (serde_json::json!([{"name": "gh", "url": "https://x.example/mcp", "timeout_ms": 0}]), "timeout_ms"),
            (serde_json::json!([{"name": "gh", "url": "https://x.example/mcp", "tools": ["a", "a"]}]), "twice"),
            (
                serde_json::json!([{"name": "gh", "url": "https://x", "headers_from_env": {"A": "AWS_X"}}]),
                "not an allowed",
            ),
            (serde_json::json!([{"name": "gh", "url": "https://x", "pinned": {"a": "b"}}]), "unknown field"),
            (
                serde_json::json!([{"name": "gh", "url": "https://x", "headers_from_env": {"Agent-Runs-Approval": "X"}}]),
                "set by the service",
            ),
            (serde_json::json!([{"name": "a", "url": "https://x"}, {"name": "a_", "url": "https://y"}]), "both claim"),
            (
                serde_json::json!([{"name": "a__b", "url": "https://x"}, {"name": "a", "url": "https://y"}]),
                "both claim",
            ),
            (
                serde_json::json!([{"name": "gh", "url": "https://x"}, {"name": "gh_enterprise", "url": "https://y"}]),
                "ok",
            ),
        ];
        for (servers, expected) in cases {
            let mut document = definition();
            document["mcp_servers"] = servers.clone();
            match parse(document) {
                Ok(_) => assert_eq!(expected, "ok", "{servers}"),
                Err(error) => assert!(error.contains(expected), "{servers}: {error}"),
            }
        }
        let mut document = definition();
        document["tools"][0]["name"] = serde_json::json!("github__list");
        document["mcp_servers"] = serde_json::json!([server]);
        assert!(parse(document).unwrap_err().contains("would clash"));
        let mut document = definition();
        document["mcp_servers"] = serde_json::json!([{"name": "gh", "url": "http://127.0.0.1:9/mcp"}]);
        document["allow_private_network"] = serde_json::json!(true);
        assert!(parse(document).is_ok(), "http:// with the opt-in");
    }
}
