//! An agent definition as both stores keep it (SQLite's `definition`
//! column, DynamoDB's `definition` attribute: this record's JSON), not the
//! domain's [`AgentDefinition`], whose serde form is what an operator
//! writes. The names and encodings here are the stored format; a record
//! that does not read back as a definition is a [`StoreError::Defect`].
//! A field added later must read as its default from older records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StoreError;
use agent_runs_domain::{AgentDefinition, McpApproval, McpServerDefinition, ProviderKind, ToolDefinition, ToolMethod};

#[derive(Debug, Serialize, Deserialize)]
struct StoredAgent {
    name: String,
    description: Option<String>,
    provider: String,
    model: String,
    base_url: Option<String>,
    api_key_env: Option<String>,
    system_prompt: String,
    max_steps: u32,
    max_tokens: Option<u32>,
    tools: Vec<StoredTool>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    allow_private_network: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    separate_approver: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_total_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tool_calls: Option<u64>,
    /// Absent (false) from definitions stored before questions.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    ask_human: bool,
    /// Absent (none) from definitions stored before MCP servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mcp_servers: Vec<StoredMcpServer>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredMcpServer {
    name: String,
    url: String,
    headers_from_env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<String>>,
    require_approval: String,
    timeout_ms: u64,
    /// The server's name of each tool to its pin (SHA-256, hex).
    pinned: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredTool {
    name: String,
    description: String,
    parameters: serde_json::Value,
    method: String,
    url: String,
    headers_from_env: BTreeMap<String, String>,
    timeout_ms: u64,
    max_response_bytes: usize,
    requires_approval: bool,
    /// Absent (false) from definitions stored before policies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    always_ask: bool,
    /// Absent from definitions stored before veto windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auto_approve_after_secs: Option<u64>,
}

fn provider_name(provider: ProviderKind) -> &'static str {
    match provider {
        ProviderKind::Bedrock => "bedrock",
        ProviderKind::Openai => "openai",
    }
}

fn provider(name: &str) -> Result<ProviderKind, StoreError> {
    match name {
        "bedrock" => Ok(ProviderKind::Bedrock),
        "openai" => Ok(ProviderKind::Openai),
        _ => Err(defect("provider")),
    }
}

fn method(name: &str) -> Result<ToolMethod, StoreError> {
    [ToolMethod::Get, ToolMethod::Post, ToolMethod::Put, ToolMethod::Patch, ToolMethod::Delete]
        .into_iter()
        .find(|method| method.as_str() == name)
        .ok_or_else(|| defect("tool method"))
}

fn defect(what: &str) -> StoreError {
    StoreError::Defect(format!("malformed stored agent: {what}"))
}

/// The definition's stored text.
pub fn encode_agent(agent: &AgentDefinition) -> Result<String, StoreError> {
    let tools = agent
        .tools
        .iter()
        .map(|tool| StoredTool {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
            method: tool.method.as_str().to_owned(),
            url: tool.url.clone(),
            headers_from_env: tool.headers_from_env.clone(),
            timeout_ms: tool.timeout_ms,
            max_response_bytes: tool.max_response_bytes,
            requires_approval: tool.requires_approval,
            always_ask: tool.always_ask,
            auto_approve_after_secs: tool.auto_approve_after_secs,
        })
        .collect();
    let stored = StoredAgent {
        name: agent.name.clone(),
        description: agent.description.clone(),
        provider: provider_name(agent.provider).to_owned(),
        model: agent.model.clone(),
        base_url: agent.base_url.clone(),
        api_key_env: agent.api_key_env.clone(),
        system_prompt: agent.system_prompt.clone(),
        max_steps: agent.max_steps,
        max_tokens: agent.max_tokens,
        tools,
        allow_private_network: agent.allow_private_network,
        separate_approver: agent.separate_approver,
        max_total_tokens: agent.max_total_tokens,
        max_tool_calls: agent.max_tool_calls,
        ask_human: agent.ask_human,
        mcp_servers: agent
            .mcp_servers
            .iter()
            .map(|server| StoredMcpServer {
                name: server.name.clone(),
                url: server.url.clone(),
                headers_from_env: server.headers_from_env.clone(),
                tools: server.tools.clone(),
                require_approval: server.require_approval.as_str().to_owned(),
                timeout_ms: server.timeout_ms,
                pinned: server.pinned.clone(),
            })
            .collect(),
    };
    serde_json::to_string(&stored).map_err(|error| StoreError::Defect(format!("cannot encode an agent: {error}")))
}

/// The definition a stored text holds.
pub fn decode_agent(text: &str) -> Result<AgentDefinition, StoreError> {
    let stored: StoredAgent = serde_json::from_str(text).map_err(|_| defect("not a definition"))?;
    let tools = stored
        .tools
        .into_iter()
        .map(|tool| {
            Ok(ToolDefinition {
                name: tool.name,
                description: tool.description,
                parameters: tool.parameters,
                method: method(&tool.method)?,
                url: tool.url,
                headers_from_env: tool.headers_from_env,
                timeout_ms: tool.timeout_ms,
                max_response_bytes: tool.max_response_bytes,
                requires_approval: tool.requires_approval,
                always_ask: tool.always_ask,
                auto_approve_after_secs: tool.auto_approve_after_secs,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(AgentDefinition {
        name: stored.name,
        description: stored.description,
        provider: provider(&stored.provider)?,
        model: stored.model,
        base_url: stored.base_url,
        api_key_env: stored.api_key_env,
        system_prompt: stored.system_prompt,
        max_steps: stored.max_steps,
        max_tokens: stored.max_tokens,
        tools,
        allow_private_network: stored.allow_private_network,
        separate_approver: stored.separate_approver,
        max_total_tokens: stored.max_total_tokens,
        max_tool_calls: stored.max_tool_calls,
        ask_human: stored.ask_human,
        mcp_servers: stored
            .mcp_servers
            .into_iter()
            .map(|server| {
                Ok(McpServerDefinition {
                    name: server.name,
                    url: server.url,
                    headers_from_env: server.headers_from_env,
                    tools: server.tools,
                    require_approval: McpApproval::parse(&server.require_approval)
                        .ok_or_else(|| defect("MCP require_approval"))?,
                    timeout_ms: server.timeout_ms,
                    pinned: server.pinned,
                })
            })
            .collect::<Result<_, StoreError>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the stores wrote before this record: the definition's own serde
    /// form. It reads back, and is written again byte for byte.
    const WRITTEN_BEFORE: &str = r#"{"name":"janitor","description":"Cleans up","provider":"openai","model":"gpt-4o-mini","base_url":"http://127.0.0.1:9/v1","api_key_env":"KEY","system_prompt":"Be tidy.","max_steps":7,"max_tokens":null,"tools":[{"name":"delete_file","description":"Deletes a file","parameters":{"properties":{"path":{"type":"string"}},"type":"object"},"method":"DELETE","url":"https://tools.example/files","headers_from_env":{"authorization":"TOOLS_TOKEN"},"timeout_ms":10000,"max_response_bytes":65536,"requires_approval":true}],"separate_approver":true,"max_tool_calls":3}"#;

    #[test]
    fn a_definition_stored_before_reads_back_and_is_written_the_same() {
        let agent = decode_agent(WRITTEN_BEFORE).unwrap();
        assert_eq!(agent.tools[0].method, ToolMethod::Delete);
        assert!(agent.separate_approver && !agent.allow_private_network);
        assert_eq!(encode_agent(&agent).unwrap(), WRITTEN_BEFORE);
        assert_eq!(serde_json::to_string(&agent).unwrap(), WRITTEN_BEFORE, "as the definition's own form wrote it");
    }

    #[test]
    fn a_record_that_is_not_a_definition_is_a_defect() {
        let wrong_method = WRITTEN_BEFORE.replace("\"DELETE\"", "\"FETCH\"");
        let wrong_provider = WRITTEN_BEFORE.replace("\"openai\"", "\"acme\"");
        for text in ["{}", "[]", wrong_method.as_str(), wrong_provider.as_str()] {
            assert!(matches!(decode_agent(text), Err(StoreError::Defect(_))), "{text}");
        }
    }

    #[test]
    fn an_mcp_server_and_its_pins_read_back() {
        let mut agent = decode_agent(WRITTEN_BEFORE).unwrap();
        agent.mcp_servers.push(McpServerDefinition {
            name: "github".into(),
            url: "https://mcp.example/mcp".into(),
            headers_from_env: BTreeMap::from([("Authorization".into(), "GH_TOKEN".into())]),
            tools: Some(vec!["close_issue".into()]),
            require_approval: McpApproval::Always,
            timeout_ms: 5_000,
            pinned: BTreeMap::from([("close_issue".into(), "ab".repeat(32))]),
        });
        let text = encode_agent(&agent).unwrap();
        assert!(text.contains(r#""require_approval":"always""#), "{text}");
        assert_eq!(decode_agent(&text).unwrap(), agent);
        let wrong = text.replace(r#""always""#, r#""sometimes""#);
        assert!(matches!(decode_agent(&wrong), Err(StoreError::Defect(_))));
    }
}
