//! Any endpoint that speaks OpenAI's chat-completions protocol with tool
//! calls: OpenAI itself, vLLM, Ollama, llama.cpp's server, LiteLLM, ...

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::model::{ChatModel, ChatReply, ChatRequest, Message, ProviderError, ToolCall};
use agent_runs_domain::Usage;

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

pub struct OpenAiModel {
    http: reqwest::Client,
    url: String,
    /// Read when the agent is built; never logged or shown.
    api_key: Option<String>,
}

impl OpenAiModel {
    pub fn new(http: reqwest::Client, base_url: Option<&str>, api_key: Option<String>) -> Self {
        let base = base_url.unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/');
        Self { http, url: format!("{base}/chat/completions"), api_key }
    }
}

fn wire_messages(system: &str, messages: &[Message]) -> Vec<Value> {
    let mut wire = vec![json!({"role": "system", "content": system})];
    for message in messages {
        wire.push(match message {
            Message::User { text } => json!({"role": "user", "content": text}),
            Message::Assistant { text, tool_calls } => {
                let mut assistant = json!({"role": "assistant", "content": text});
                if !tool_calls.is_empty() {
                    assistant["tool_calls"] = tool_calls
                        .iter()
                        .map(|call| {
                            json!({"id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": call.arguments}})
                        })
                        .collect();
                }
                assistant
            }
            Message::Tool { call_id, content, .. } => {
                json!({"role": "tool", "tool_call_id": call_id, "content": content})
            }
        });
    }
    wire
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: WireMessage,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Deserialize)]
struct WireToolCall {
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    total_tokens: u64,
}

fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let seconds: f64 = response.headers().get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

#[async_trait]
impl ChatModel for OpenAiModel {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<ChatReply, ProviderError> {
        let mut body = json!({"model": request.model, "messages": wire_messages(request.system, request.messages)});
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({"type": "function", "function": {
                        "name": tool.name, "description": tool.description, "parameters": tool.parameters}})
                })
                .collect();
        }
        if let Some(max_tokens) = request.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        let mut call = self
            .http
            .post(&self.url)
            .timeout(REQUEST_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(key) = &self.api_key {
            call = call.bearer_auth(key);
        }
        let response = call.send().await.map_err(|error| {
            let what = if error.is_timeout() { "the request timed out" } else { "could not reach the provider" };
            tracing::warn!(error = %agent_runs_ports::error_chain(&error.without_url()), "model request failed");
            ProviderError::retryable(what)
        })?;
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() || status.as_u16() == 408 {
            return Err(ProviderError::Retryable {
                message: format!("HTTP {}", status.as_u16()),
                retry_after: retry_after(&response),
            });
        }
        if !status.is_success() {
            return Err(ProviderError::Permanent(format!(
                "The model provider refused the request (HTTP {}); check the agent's model, base URL and API key.",
                status.as_u16()
            )));
        }
        let text = response.text().await.map_err(|_| ProviderError::retryable("the reply was cut off"))?;
        let completion: Completion = serde_json::from_str(&text)
            .map_err(|_| ProviderError::Permanent("The model provider's reply was not a chat completion.".into()))?;
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(ProviderError::Permanent("The model provider's reply had no choices.".into()));
        };
        Ok(ChatReply {
            text: choice.message.content,
            tool_calls: choice
                .message
                .tool_calls
                .into_iter()
                .map(|call| ToolCall { id: call.id, name: call.function.name, arguments: call.function.arguments })
                .collect(),
            usage: completion.usage.map(|usage| Usage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
                total_tokens: usage.total_tokens.max(usage.prompt_tokens + usage.completion_tokens),
                tool_calls: 0,
            }),
        })
    }
}
