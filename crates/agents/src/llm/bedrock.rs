//! Amazon Bedrock through its Converse API, with the process's AWS
//! credentials (the worker function's IAM role on AWS).

use async_trait::async_trait;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::operation::converse::ConverseError;
use aws_sdk_bedrockruntime::types::{
    ContentBlock, ConversationRole, InferenceConfiguration, Message as WireMessage, SystemContentBlock, Tool,
    ToolConfiguration, ToolInputSchema, ToolResultBlock, ToolResultContentBlock, ToolResultStatus, ToolSpecification,
    ToolUseBlock,
};
use aws_smithy_types::{Document, Number};
use serde_json::Value;

use super::model::{ChatModel, ChatReply, ChatRequest, Message, ProviderError, ToolCall};
use agent_runs_domain::Usage;

/// The longest one Bedrock call may take: long answers of large models
/// take minutes.
pub(super) const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

pub struct BedrockModel {
    client: Client,
}

impl BedrockModel {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

pub fn to_document(value: &Value) -> Document {
    match value {
        Value::Null => Document::Null,
        Value::Bool(flag) => Document::Bool(*flag),
        Value::Number(number) => Document::Number(match (number.as_u64(), number.as_i64()) {
            (Some(unsigned), _) => Number::PosInt(unsigned),
            (None, Some(signed)) => Number::NegInt(signed),
            _ => Number::Float(number.as_f64().unwrap_or_default()),
        }),
        Value::String(text) => Document::String(text.clone()),
        Value::Array(items) => Document::Array(items.iter().map(to_document).collect()),
        Value::Object(fields) => {
            Document::Object(fields.iter().map(|(key, value)| (key.clone(), to_document(value))).collect())
        }
    }
}

pub fn to_value(document: &Document) -> Value {
    match document {
        Document::Null => Value::Null,
        Document::Bool(flag) => Value::Bool(*flag),
        Document::Number(Number::PosInt(unsigned)) => Value::from(*unsigned),
        Document::Number(Number::NegInt(signed)) => Value::from(*signed),
        Document::Number(Number::Float(float)) => Value::from(*float),
        Document::String(text) => Value::String(text.clone()),
        Document::Array(items) => Value::Array(items.iter().map(to_value).collect()),
        Document::Object(fields) => {
            Value::Object(fields.iter().map(|(key, value)| (key.clone(), to_value(value))).collect())
        }
    }
}

fn build_error(error: impl std::fmt::Display) -> ProviderError {
    tracing::error!(%error, "cannot build a Bedrock request");
    ProviderError::Permanent("The agent's conversation could not be sent to Bedrock.".into())
}

/// Converse wants strict turns: the tool results that answer one assistant
/// turn travel together in the next user turn.
fn wire_messages(messages: &[Message]) -> Result<Vec<WireMessage>, ProviderError> {
    let mut wire: Vec<(ConversationRole, Vec<ContentBlock>)> = Vec::new();
    for message in messages {
        let (role, block) = match message {
            Message::User { text } => (ConversationRole::User, vec![ContentBlock::Text(text.clone())]),
            Message::Assistant { text, tool_calls } => {
                let mut blocks: Vec<ContentBlock> =
                    text.iter().filter(|text| !text.is_empty()).cloned().map(ContentBlock::Text).collect();
                for call in tool_calls {
                    let input = serde_json::from_str(&call.arguments).unwrap_or(Value::Object(Default::default()));
                    let block = ToolUseBlock::builder()
                        .tool_use_id(&call.id)
                        .name(&call.name)
                        .input(to_document(&input))
                        .build()
                        .map_err(build_error)?;
                    blocks.push(ContentBlock::ToolUse(block));
                }
                (ConversationRole::Assistant, blocks)
            }
            Message::Tool { call_id, content, is_error } => {
                let result = ToolResultBlock::builder()
                    .tool_use_id(call_id)
                    .content(ToolResultContentBlock::Text(content.clone()))
                    .status(if *is_error { ToolResultStatus::Error } else { ToolResultStatus::Success })
                    .build()
                    .map_err(build_error)?;
                (ConversationRole::User, vec![ContentBlock::ToolResult(result)])
            }
        };
        match wire.last_mut() {
            Some((last_role, blocks)) if *last_role == role => blocks.extend(block),
            _ => wire.push((role, block)),
        }
    }
    wire.into_iter()
        .map(|(role, content)| {
            WireMessage::builder().role(role).set_content(Some(content)).build().map_err(build_error)
        })
        .collect()
}

/// The error's code: from the response, else the modeled error's name.
fn error_code(error: &ConverseError) -> &str {
    let named = match error {
        ConverseError::AccessDeniedException(_) => "AccessDeniedException",
        ConverseError::ResourceNotFoundException(_) => "ResourceNotFoundException",
        ConverseError::ValidationException(_) => "ValidationException",
        ConverseError::ModelErrorException(_) => "ModelErrorException",
        ConverseError::ThrottlingException(_) => "ThrottlingException",
        _ => "UnknownError",
    };
    error.code().unwrap_or(named)
}

fn classify(error: SdkError<ConverseError>) -> ProviderError {
    let code = error.as_service_error().map(error_code).unwrap_or_default().to_owned();
    match &error {
        SdkError::ServiceError(service) => match service.err() {
            ConverseError::ThrottlingException(_)
            | ConverseError::ServiceUnavailableException(_)
            | ConverseError::InternalServerException(_)
            | ConverseError::ModelNotReadyException(_)
            | ConverseError::ModelTimeoutException(_) => ProviderError::retryable(code),
            _ if service.raw().status().is_server_error() => ProviderError::retryable(code),
            _ => {
                tracing::warn!(%code, message = error.message().unwrap_or(""), "Bedrock refused the request");
                ProviderError::Permanent(format!(
                    "Bedrock refused the request ({code}); check the agent's model id and the worker's permissions."
                ))
            }
        },
        // Not tried again: the limit is long, and a model that needed longer
        // would need it again (each try paid for).
        SdkError::TimeoutError(_) => {
            ProviderError::Permanent(format!("Bedrock did not answer within {} seconds.", CALL_TIMEOUT.as_secs()))
        }
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            ProviderError::retryable("could not reach Bedrock")
        }
        _ => {
            tracing::error!(error = %agent_runs_ports::error_chain(&error), "Bedrock request could not be made");
            ProviderError::Permanent("The request to Bedrock could not be made.".into())
        }
    }
}

#[async_trait]
impl ChatModel for BedrockModel {
    async fn complete(&self, request: &ChatRequest<'_>) -> Result<ChatReply, ProviderError> {
        let mut call = self
            .client
            .converse()
            .model_id(request.model)
            .system(SystemContentBlock::Text(request.system.to_owned()))
            .set_messages(Some(wire_messages(request.messages)?));
        if !request.tools.is_empty() {
            let mut tools = ToolConfiguration::builder();
            for tool in request.tools {
                let spec = ToolSpecification::builder()
                    .name(&tool.name)
                    .description(&tool.description)
                    .input_schema(ToolInputSchema::Json(to_document(&tool.parameters)))
                    .build()
                    .map_err(build_error)?;
                tools = tools.tools(Tool::ToolSpec(spec));
            }
            call = call.tool_config(tools.build().map_err(build_error)?);
        }
        if let Some(max_tokens) = request.max_tokens {
            call = call.inference_config(
                InferenceConfiguration::builder().max_tokens(i32::try_from(max_tokens).unwrap_or(i32::MAX)).build(),
            );
        }
        let output = call.send().await.map_err(classify)?;
        let mut reply = ChatReply {
            usage: output.usage().map(|usage| Usage {
                input_tokens: usage.input_tokens().max(0) as u64,
                output_tokens: usage.output_tokens().max(0) as u64,
                total_tokens: usage.total_tokens().max(0) as u64,
                tool_calls: 0,
            }),
            ..ChatReply::default()
        };
        let message = output
            .output()
            .and_then(|output| output.as_message().ok())
            .ok_or_else(|| ProviderError::Permanent("Bedrock's reply had no message.".into()))?;
        let mut texts = Vec::new();
        for block in message.content() {
            match block {
                ContentBlock::Text(text) => texts.push(text.clone()),
                ContentBlock::ToolUse(tool_use) => reply.tool_calls.push(ToolCall {
                    id: tool_use.tool_use_id().to_owned(),
                    name: tool_use.name().to_owned(),
                    arguments: to_value(tool_use.input()).to_string(),
                }),
                _ => {}
            }
        }
        reply.text = (!texts.is_empty()).then(|| texts.join("\n"));
        Ok(reply)
    }
}
