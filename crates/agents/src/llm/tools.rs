//! Tools: HTTP endpoints declared in an agent definition. What a call
//! returns, success or not, goes back to the model as text.

use std::time::Duration;

use serde_json::Value;

use crate::public_network::{self, NotPublic};
use agent_runs_domain::{
    CompiledSchema, ToolDefinition, canonical_json, compile_kept_schema, compile_listed_schema, exact_canonical,
};

/// A definition's tool with its compiled argument schema.
pub struct Tool {
    pub definition: ToolDefinition,
    schema: CompiledSchema,
    /// For a tool of an MCP server: which, and the tool's name there.
    pub mcp: Option<McpBinding>,
}

/// Where an MCP tool lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpBinding {
    pub server: String,
    pub tool: String,
    /// Its pin as the server lists it now.
    pub pin: String,
    /// New or changed since the server was pinned: a person decides.
    pub changed: bool,
}

/// What a tool call produced, for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    pub content: String,
    pub is_error: bool,
    /// The status of the tool's HTTP answer; `None` when none came.
    pub http_status: Option<u16>,
}

impl ToolOutcome {
    pub fn error(content: impl Into<String>) -> Self {
        Self { content: content.into(), is_error: true, http_status: None }
    }
}

/// The client a tool call goes through, and whether it reaches public
/// addresses only ([`super::LlmRuntime::tool_http`]).
#[derive(Clone)]
pub struct ToolHttp {
    pub client: reqwest::Client,
    pub public_only: bool,
}

/// What the model is told when a tool's address is refused; which address,
/// and why, is for the log only.
const NOT_PUBLIC: &str =
    "The tool's address is not allowed: it resolves to a private or local network address. The call was not made.";

/// Whether a failed request failed because its destination is not public.
pub(super) fn refused_as_not_public(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        if cause.downcast_ref::<NotPublic>().is_some() {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Reads an environment variable (the process's, or a test's).
pub type EnvLookup = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

const MAX_SCHEMA_ERRORS: usize = 3;

fn timed_out(tool: &ToolDefinition) -> String {
    format!("The tool did not answer within {} ms.", tool.timeout_ms)
}

impl Tool {
    /// A stored definition's tool (`agents put` held its schema to every
    /// limit; one stored before a limit still reads).
    pub fn new(definition: ToolDefinition) -> Result<Self, String> {
        let schema = compile_kept_schema(&definition.parameters)?;
        Ok(Self { definition, schema, mcp: None })
    }

    /// A tool as an MCP server lists it now.
    pub fn listed(definition: ToolDefinition, binding: McpBinding) -> Result<Self, String> {
        let schema = compile_listed_schema(&definition.parameters)?;
        Ok(Self { definition, schema, mcp: Some(binding) })
    }

    /// How the model is offered the tool.
    pub fn spec(&self) -> super::ToolSpec {
        super::ToolSpec {
            name: self.definition.name.clone(),
            description: self.definition.description.clone(),
            parameters: self.definition.parameters.clone(),
        }
    }

    /// The arguments as an object that matches the schema, or what is wrong
    /// with them in words the model can act on.
    pub fn check_arguments(&self, arguments: &str) -> Result<Value, String> {
        let text = if arguments.trim().is_empty() { "{}" } else { arguments };
        let value: Value = serde_json::from_str(text)
            .map_err(|error| format!("The arguments are not valid JSON ({error}); send a JSON object."))?;
        // A call put to a person is kept, shown and sent as its digest's
        // text: its numbers must read the same everywhere.
        let value = if self.definition.requires_approval {
            exact_canonical(&value).map_err(|problem| format!("The arguments cannot be put to a person: {problem}"))?
        } else {
            value
        };
        let problems = self.schema.problems(&value, MAX_SCHEMA_ERRORS);
        if problems.is_empty() {
            Ok(value)
        } else {
            Err(format!("The arguments do not match the tool's schema: {}.", problems.join("; ")))
        }
    }

    /// The JSON text a call sends: an approved call's is the text its
    /// digest covers (RFC 8785), so the tool gets exactly what a person
    /// approved; others keep every digit the model wrote.
    fn body(&self, value: &Value, approved: bool) -> String {
        if self.definition.requires_approval || approved { canonical_json(value) } else { value.to_string() }
    }

    /// Calls the endpoint once. `idempotency_key` is the same for every
    /// attempt at this call, so an endpoint can drop a repeat.
    pub async fn call(
        &self,
        http: &ToolHttp,
        arguments: &Value,
        idempotency_key: &str,
        env: &EnvLookup,
        receipt: Option<&str>,
    ) -> ToolOutcome {
        let tool = &self.definition;
        let method = reqwest::Method::from_bytes(tool.method.as_str().as_bytes()).unwrap_or(reqwest::Method::POST);
        // An IP address in the URL is never resolved, so the resolver
        // cannot refuse it: it is looked at here, as is `localhost`.
        if http.public_only && public_network::check_url(&tool.url).is_err() {
            tracing::warn!(tool = %tool.name, "a tool call to a private or local address was refused");
            return ToolOutcome::error(NOT_PUBLIC);
        }
        let mut request = http
            .client
            .request(method, &tool.url)
            .timeout(Duration::from_millis(tool.timeout_ms))
            .header("Idempotency-Key", idempotency_key);
        if let Some(receipt) = receipt {
            request = request.header(agent_runs_ports::receipts::RECEIPT_HEADER, receipt);
        }
        if tool.method.has_body() {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(self.body(arguments, receipt.is_some()));
        } else if let Value::Object(fields) = arguments {
            let pairs: Vec<(&str, String)> = fields
                .iter()
                .map(|(key, value)| match value {
                    Value::String(text) => (key.as_str(), text.clone()),
                    other => (key.as_str(), self.body(other, receipt.is_some())),
                })
                .collect();
            request = request.query(&pairs);
        }
        for (header, variable) in &tool.headers_from_env {
            let Some(value) = env(variable) else {
                tracing::error!(tool = %tool.name, %variable, "a tool header's environment variable is not set");
                return ToolOutcome::error("The tool is not configured on this deployment; it could not be called.");
            };
            request = request.header(header.as_str(), value);
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_timeout() => {
                return ToolOutcome::error(timed_out(tool));
            }
            Err(error) if refused_as_not_public(&error) => {
                tracing::warn!(tool = %tool.name, "a tool call to a name that resolves only to private or local addresses was refused");
                return ToolOutcome::error(NOT_PUBLIC);
            }
            Err(error) => {
                tracing::warn!(tool = %tool.name, error = %agent_runs_ports::error_chain(&error.without_url()), "tool call failed");
                return ToolOutcome::error("The tool could not be reached.");
            }
        };
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() > tool.max_response_bytes => {
                    return ToolOutcome::error(format!(
                        "The tool's response was longer than {} bytes; it was dropped.",
                        tool.max_response_bytes
                    ));
                }
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(error) if error.is_timeout() => {
                    return ToolOutcome::error(timed_out(tool));
                }
                Err(_) => return ToolOutcome::error("The tool's response was cut off."),
            }
        }
        let text = String::from_utf8_lossy(&body).into_owned();
        let status = response.status();
        let outcome = if status.is_success() {
            ToolOutcome { content: text, is_error: false, http_status: None }
        } else if status.is_redirection() {
            ToolOutcome::error(format!(
                "The tool answered HTTP {}, a redirect; tool calls do not follow redirects: {text}",
                status.as_u16()
            ))
        } else {
            ToolOutcome::error(format!("The tool answered HTTP {}: {text}", status.as_u16()))
        };
        ToolOutcome { http_status: Some(status.as_u16()), ..outcome }
    }
}
