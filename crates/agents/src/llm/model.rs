//! The conversation as the agent keeps it, whatever the provider, and the
//! port every provider implements.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use agent_runs_domain::Usage;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    User {
        text: String,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The answer to one tool call.
    Tool {
        call_id: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: JSON text, perhaps malformed.
    pub arguments: String,
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub system: &'a str,
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    pub max_tokens: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatReply {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Throttling, a 5xx, a timeout or a lost connection: worth another try.
    #[error("{message}")]
    Retryable { message: String, retry_after: Option<Duration> },
    /// The request itself is wrong (credentials, model id, a 4xx): retrying
    /// cannot help. The message is safe to show on the run.
    #[error("{0}")]
    Permanent(String),
}

impl ProviderError {
    pub fn retryable(message: impl Into<String>) -> Self {
        ProviderError::Retryable { message: message.into(), retry_after: None }
    }
}

#[async_trait]
pub trait ChatModel: Send + Sync {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<ChatReply, ProviderError>;
}

/// How model calls are retried within one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in all, the first included.
    pub attempts: u32,
    /// The wait before the first retry; doubled each time, with jitter.
    pub base_delay: Duration,
    /// No single wait is longer, whatever `Retry-After` asks for.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { attempts: 4, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(20) }
    }
}

/// Calls the model, retrying what is worth retrying with exponential
/// backoff ("full jitter") or the provider's `Retry-After`.
pub async fn complete_with_retries(
    model: &dyn ChatModel,
    request: &ChatRequest<'_>,
    policy: &RetryPolicy,
) -> Result<ChatReply, ProviderError> {
    let mut attempt = 1;
    loop {
        match model.complete(request).await {
            Err(ProviderError::Retryable { message, retry_after }) if attempt < policy.attempts => {
                let backoff = policy.base_delay.saturating_mul(1 << (attempt - 1).min(16)).min(policy.max_delay);
                let wait = match retry_after {
                    Some(asked) => asked.min(policy.max_delay),
                    None => backoff.mul_f64(rand::random_range(0.5..=1.0)),
                };
                tracing::warn!(attempt, wait_ms = wait.as_millis() as u64, %message, "model call failed; retrying");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(ProviderError::Retryable { message, .. }) => {
                tracing::warn!(attempt, %message, "model call failed; giving up");
                return Err(ProviderError::Permanent(format!(
                    "The model provider was unavailable after {attempt} attempts ({message}); run the agent again later."
                )));
            }
            other => return other,
        }
    }
}
