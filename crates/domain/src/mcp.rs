//! MCP servers as tools: a definition's `[[mcp_servers]]`, and the pins
//! that make a tool changed on its server ask a person again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::approval::{canonical_json, sha256_hex};

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
