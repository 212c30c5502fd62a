//! MCP servers as tools: a definition's `[[mcp_servers]]`, and the pins
//! that make a tool changed on its server ask a person again.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{DefinitionError, MAX_TOOL_TIMEOUT_MS, canonical_json};
use crate::agent::valid_url;
use crate::approval::sha256_hex;

pub const MAX_MCP_SERVER_NAME_CHARS: usize = 32;
/// Tool names are `<server>__<tool>`.
pub const MCP_TOOL_SEPARATOR: &str = "__";
/// The most text one MCP tool result may give the model (as an HTTP tool's default).
pub const MAX_MCP_RESULT_BYTES: usize = 65_536;

/// Which calls of a server's tools a person decides.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpApproval {
    /// Tools annotated `readOnlyHint: true` run without a person.
    #[default]
    UnlessReadOnly,
    Always,
    Never,
}

impl McpApproval {
    pub fn as_str(self) -> &'static str {
        match self {
            McpApproval::UnlessReadOnly => "unless_read_only",
            McpApproval::Always => "always",
            McpApproval::Never => "never",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [McpApproval::UnlessReadOnly, McpApproval::Always, McpApproval::Never]
            .into_iter()
            .find(|approval| approval.as_str() == text)
    }

    /// Whether a call of a tool with these annotations needs a person
    /// (before policies).
    pub fn requires_approval(self, read_only: bool) -> bool {
        match self {
            McpApproval::UnlessReadOnly => !read_only,
            McpApproval::Always => true,
            McpApproval::Never => false,
        }
    }
}

fn default_mcp_timeout_ms() -> u64 {
    30_000
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerDefinition {
    /// 1 to 32 of `a-z 0-9 _ -`; its tools are `<name>__<tool>`.
    pub name: String,
    /// The Streamable HTTP endpoint; `https://` unless the definition
    /// allows private networks.
    pub url: String,
    #[serde(default)]
    pub headers_from_env: BTreeMap<String, String>,
    /// The only tools offered (the server's own names); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub require_approval: McpApproval,
    /// Each request to the server (the handshake, a listing, a call).
    #[serde(default = "default_mcp_timeout_ms")]
    pub timeout_ms: u64,
    /// The tools as `agents put` found them: the server's name of each to
    /// its [`tool_pin`]. Set by pinning, never read from a definition file.
    #[serde(default, skip_deserializing, skip_serializing_if = "BTreeMap::is_empty")]
    pub pinned: BTreeMap<String, String>,
}

impl McpServerDefinition {
    /// Whether the allow-list lets the model see `tool`.
    pub fn offers(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|tools| tools.iter().any(|name| name == tool))
    }

    /// What the model calls the server's `tool`.
    pub fn tool_name(&self, tool: &str) -> String {
        format!("{}{MCP_TOOL_SEPARATOR}{tool}", self.name)
    }

    /// Whether the tool is new or changed since the server was pinned.
    pub fn changed(&self, tool: &str, pin: &str) -> bool {
        self.pinned.get(tool).is_none_or(|pinned| pinned != pin)
    }
}

impl super::AgentDefinition {
    /// The MCP server a tool name of the model's belongs to, and the
    /// tool's name there (the definition's checks make it at most one).
    pub fn mcp_tool<'n>(&self, name: &'n str) -> Option<(&McpServerDefinition, &'n str)> {
        self.mcp_servers.iter().find_map(|server| {
            let tool = name.strip_prefix(&server.tool_name(""))?;
            (!tool.is_empty()).then_some((server, tool))
        })
    }
}

/// The SHA-256 (hex) of a tool's canonical JSON (RFC 8785) of its name,
/// description, input schema and annotations, as the server lists them.
pub fn tool_pin(name: &str, description: Option<&str>, input_schema: &Value, annotations: Option<&Value>) -> String {
    let pinned = json!({
        "name": name,
        "description": description,
        "inputSchema": input_schema,
        "annotations": annotations,
    });
    sha256_hex(canonical_json(&pinned).as_bytes())
}

pub fn valid_mcp_server_name(name: &str) -> bool {
    (1..=MAX_MCP_SERVER_NAME_CHARS).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-')
}

/// Checks the servers of a definition whose HTTP tools are `tool_names`.
pub(super) fn check_servers(
    servers: &[McpServerDefinition],
    tool_names: &BTreeSet<&str>,
    allow_private_network: bool,
    check_headers: impl Fn(&str, &BTreeMap<String, String>) -> Result<(), DefinitionError>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_covers_what_the_model_and_the_gate_read_and_nothing_else() {
        let schema = json!({"type": "object", "properties": {"id": {"type": "string"}}});
        let pin = tool_pin("close", Some("Closes"), &schema, Some(&json!({"readOnlyHint": false})));
        assert_eq!(pin.len(), 64);
        assert_eq!(pin, tool_pin("close", Some("Closes"), &schema, Some(&json!({"readOnlyHint": false}))));
        let reordered = json!({"properties": {"id": {"type": "string"}}, "type": "object"});
        assert_eq!(pin, tool_pin("close", Some("Closes"), &reordered, Some(&json!({"readOnlyHint": false}))));
        assert_ne!(pin, tool_pin("close", Some("Closes all"), &schema, Some(&json!({"readOnlyHint": false}))));
        assert_ne!(pin, tool_pin("close", Some("Closes"), &schema, Some(&json!({"readOnlyHint": true}))));
        assert_ne!(pin, tool_pin("close", Some("Closes"), &json!({"type": "object"}), None));
    }

    #[test]
    fn approval_modes() {
        assert!(!McpApproval::UnlessReadOnly.requires_approval(true));
        assert!(McpApproval::UnlessReadOnly.requires_approval(false));
        assert!(McpApproval::Always.requires_approval(true));
        assert!(!McpApproval::Never.requires_approval(false));
        for mode in [McpApproval::UnlessReadOnly, McpApproval::Always, McpApproval::Never] {
            assert_eq!(McpApproval::parse(mode.as_str()), Some(mode));
        }
    }
}
