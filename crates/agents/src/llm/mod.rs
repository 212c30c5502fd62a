//! An agent defined by the operator: a language model that calls HTTP
//! tools. One step is one model call or one tool call; the transcript is
//! the checkpoint, so a run resumes anywhere, on any worker, after any
//! number of invocations or approvals.

mod bedrock;
mod calls;
mod mcp;
mod model;
mod openai;
mod questions;
mod runtime;
mod tools;
mod transcript;

use std::sync::Arc;

use async_trait::async_trait;

use super::{Agent, Step, StepInput};
use agent_runs_domain::{
    ASK_HUMAN_TOOL, AgentDefinition, ApprovalRequest, Budget, EventData, EventText, GatedCall,
    MAX_APPROVAL_ARGUMENTS_BYTES, MAX_APPROVAL_ARGUMENTS_PER_RUN, Policy, ProposedCall, ProviderKind, RuleDecision,
    Usage, Verdict, approval_arguments_bytes, canonical_json, exact_canonical,
};

use agent_runs_platform::telemetry::{self, Span, SpanKind};
use transcript::{PendingCall, Transcript};

pub use bedrock::{BedrockModel, to_document, to_value};
pub use mcp::{ListedTool, McpSession, Unreachable, offered, pin};
pub use model::{ChatModel, ChatReply, ChatRequest, Message, ProviderError, RetryPolicy, ToolCall, ToolSpec};
pub use openai::OpenAiModel;
pub use runtime::LlmRuntime;
pub use runtime::build_client;
pub use tools::{EnvLookup, McpBinding, Tool, ToolHttp, ToolOutcome};

/// The default largest checkpoint (the transcript as JSON).
pub const DEFAULT_MAX_CHECKPOINT_BYTES: usize = 256 * 1024;
/// An approval's `action` shows at most this many characters of arguments.
const MAX_ACTION_ARGUMENT_CHARS: usize = 200;

pub struct LlmAgent {
    definition: AgentDefinition,
    model: Arc<dyn ChatModel>,
    tools: Vec<Tool>,
    specs: Vec<ToolSpec>,
    runtime: Arc<LlmRuntime>,
}

/// What judging a model turn's calls goes by: where its approvals start in
/// the run's, the policy in force, and what the run may still spend.
struct Judging<'a> {
    first_approval: usize,
    policy: &'a Policy,
    budget: Budget,
    usage: Option<&'a Usage>,
}

/// The tools of one step: the definition's HTTP tools, and what its MCP
/// servers list now (listed only by the steps that ask the model).
struct Toolbox<'a> {
    http: &'a [Tool],
    mcp: Vec<Tool>,
}

impl Toolbox<'_> {
    fn find(&self, name: &str) -> Option<&Tool> {
        self.http.iter().chain(&self.mcp).find(|tool| tool.definition.name == name)
    }
}

/// A person is asked about a call of `tool` with `arguments`.
fn asking(tool: &str, arguments: serde_json::Value) -> ApprovalRequest {
    let shown = canonical_json(&arguments);
    let action = format!("Call the tool `{tool}` with {}", shorten(&shown, MAX_ACTION_ARGUMENT_CHARS));
    ApprovalRequest::call(action, ProposedCall { tool: tool.to_owned(), arguments })
}

/// What the model is told of a call a rule denied.
fn denied_by(rule: &str, reason: Option<&str>) -> String {
    format!("denied by policy {rule}: {}", reason.unwrap_or("no reason given"))
}

fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(max_chars).collect();
    short.push('…');
    short
}

impl LlmAgent {
    /// The HTTP tools alone: what a step that does not ask the model needs.
    fn http_tools(&self) -> Toolbox<'_> {
        Toolbox { http: &self.tools, mcp: Vec::new() }
    }

    /// The HTTP tools and every tool the MCP servers offer now; a server
    /// that cannot be used fails the run.
    async fn toolbox(&self) -> Result<Toolbox<'_>, Unreachable> {
        let mut mcp = Vec::new();
        let http = self.runtime.tool_http(self.definition.allow_private_network);
        for server in &self.definition.mcp_servers {
            let session = McpSession::open(server, &http, &self.runtime.env, None).await?;
            let listed = session.list().await;
            session.close().await;
            mcp.extend(mcp::offered(server, listed?));
        }
        Ok(Toolbox { http: &self.tools, mcp })
    }

    /// Whether the call puts a question to a person.
    fn asks_humans(&self, call: &ToolCall) -> bool {
        self.definition.ask_human && call.name == ASK_HUMAN_TOOL
    }

    /// The tool a call names and its arguments, or what is wrong with the
    /// call in words for the model.
    fn checked<'t>(&self, tools: &'t Toolbox, call: &ToolCall) -> Result<(&'t Tool, serde_json::Value), String> {
        let tool =
            tools.find(&call.name).ok_or_else(|| format!("There is no tool named `{}`.", shorten(&call.name, 64)))?;
        Ok((tool, tool.check_arguments(&call.arguments)?))
    }

    /// The checkpoint for the worker to save, unless it grew too large: the
    /// oldest turns of the conversation the run continues are left out
    /// first (and that is recorded), never its own.
    fn save(&self, transcript: &mut Transcript, events: &mut Vec<EventData>) -> Result<serde_json::Value, Step> {
        let max = self.runtime.max_checkpoint_bytes;
        let encode = |transcript: &Transcript| {
            let value = serde_json::to_value(transcript)
                .map_err(|_| Step::Failed("The run's transcript could not be saved.".into()))?;
            let size = value.to_string().len();
            Ok::<_, Step>((value, size))
        };
        // Measured once; room is made (and the transcript encoded again)
        // only past the limit.
        let (mut value, mut size) = encode(transcript)?;
        if size > max {
            let dropped = transcript.make_room(max);
            if dropped.turns > 0 {
                events.push(dropped.event());
                (value, size) = encode(transcript)?;
            }
        }
        if size > max {
            return Err(Step::Failed(format!(
                "The run's transcript grew to {size} bytes, over this deployment's limit of {} bytes.",
                self.runtime.max_checkpoint_bytes
            )));
        }
        Ok(value)
    }

    fn checkpoint(&self, transcript: &mut Transcript, events: &mut Vec<EventData>) -> Step {
        self.save(transcript, events).map_or_else(|failed| failed, Step::Checkpoint)
    }

    /// What the owner's policy, or else the tool, says of a call of `tool`.
    fn verdict(&self, tool: &Tool, arguments: &serde_json::Value, policy: &Policy) -> Verdict {
        // A tool its server changed since pinning asks, whatever rules say.
        if tool.mcp.as_ref().is_some_and(|mcp| mcp.changed) {
            return Verdict::Ask { policy: None };
        }
        policy.evaluate(&GatedCall {
            agent: &self.definition.name,
            tool: &tool.definition.name,
            arguments,
            requires_approval: tool.definition.requires_approval,
            always_ask: tool.definition.always_ask,
        })
    }

    /// What a human is asked about the call (the call in plain words, and
    /// exactly), or what a rule of `policy` decided for them; `None` when
    /// the call runs without an approval.
    fn approval_request(&self, tools: &Toolbox, call: &ToolCall, policy: &Policy) -> Option<ApprovalRequest> {
        // Questions always go to a person; no rule decides them.
        if self.asks_humans(call) {
            let (question, schema) = questions::asked(&call.arguments).ok()?;
            return Some(ApprovalRequest::question(question, schema));
        }
        let tool = tools.find(&call.name)?;
        // Only checked calls get here, but the definition may have changed
        // since: the model's text is used then (the call is checked again
        // before it is made).
        let arguments = self.checked(tools, call).map(|(_, arguments)| arguments).unwrap_or_else(|_| {
            serde_json::from_str(&call.arguments).unwrap_or_else(|_| serde_json::Value::String(call.arguments.clone()))
        });
        let (policy, decided) = match self.verdict(tool, &arguments, policy) {
            Verdict::Run { .. } => return None,
            Verdict::Ask { policy } => (policy, None),
            Verdict::Allowed { policy } => (Some(policy), Some(RuleDecision::Allowed)),
            Verdict::Denied { policy, reason } => (Some(policy), Some(RuleDecision::Denied { reason })),
        };
        let tool_changed = tool.mcp.as_ref().is_some_and(|mcp| mcp.changed);
        // A tool that always asks has no window, even in a definition
        // stored before `agents put` refused one.
        let auto_approve_after = tool.definition.auto_approve_after().filter(|_| !tool.definition.always_ask);
        Some(ApprovalRequest { policy, decided, tool_changed, auto_approve_after, ..asking(&call.name, arguments) })
    }

    /// A span for a model call made now (GenAI semantic conventions).
    fn model_call_span(&self) -> Option<Span> {
        let parent = telemetry::current()?;
        let model = &self.definition.model;
        let mut span = Span::child_of(parent, format!("chat {model}"), SpanKind::Client)?;
        span.set("gen_ai.operation.name", "chat");
        span.set(
            "gen_ai.provider.name",
            match self.definition.provider {
                ProviderKind::Bedrock => "aws.bedrock",
                ProviderKind::Openai => "openai",
            },
        );
        span.set("gen_ai.request.model", model.clone());
        span.set("gen_ai.agent.name", self.definition.name.clone());
        Some(span)
    }

    /// Puts every call of the model's turn that the owner's policy or the
    /// tool puts to a human at once, with those a rule decided; `None` when
    /// no call waits for a decision.
    fn put_to_people(
        &self,
        tools: &Toolbox,
        transcript: &mut Transcript,
        judging: Judging<'_>,
        events: &mut Vec<EventData>,
    ) -> Option<Step> {
        let Judging { first_approval, policy, budget, usage } = judging;
        let mut requests = Vec::new();
        for pending in &mut transcript.pending {
            if pending.approval.is_some() {
                continue;
            }
            if let Some(request) = self.approval_request(tools, &pending.call, policy) {
                pending.approval = Some(first_approval + requests.len());
                requests.push(request);
            }
        }
        if requests.is_empty() {
            return None;
        }
        // No one is asked to approve, and no rule lets through, a call the
        // budget no longer allows (a call already decided is checked as it
        // is answered).
        let may_call = requests.iter().any(|request| {
            request.input_schema.is_none() && !matches!(request.decided, Some(RuleDecision::Denied { .. }))
        });
        if may_call && let Some(spent) = budget.within(self.definition.budget()).refuses_tool_call(usage) {
            return Some(Step::Failed(spent));
        }
        Some(match self.save(transcript, events) {
            Ok(checkpoint) => Step::AwaitApproval { requests, checkpoint },
            Err(failed) => failed,
        })
    }

    /// Asks the model what to do next.
    async fn ask_model(&self, step: StepInput<'_>, mut transcript: Transcript) -> Step {
        let StepInput { approvals, usage, budget, events, policy, .. } = step;
        if let Some(spent) = budget.within(self.definition.budget()).refuses_model_call(usage.as_ref()) {
            return Step::Failed(spent);
        }
        if transcript.model_calls >= self.definition.max_steps {
            return Step::Failed(format!(
                "The agent reached its limit of {} model calls without a final answer.",
                self.definition.max_steps
            ));
        }
        let tools = match self.toolbox().await {
            Ok(tools) => tools,
            Err(Unreachable(why)) => return Step::Failed(why),
        };
        let specs: std::borrow::Cow<[ToolSpec]> = if tools.mcp.is_empty() {
            std::borrow::Cow::Borrowed(&self.specs)
        } else {
            self.specs.iter().cloned().chain(tools.mcp.iter().map(Tool::spec)).collect()
        };
        let request = ChatRequest {
            model: &self.definition.model,
            system: &self.definition.system_prompt,
            messages: &transcript.messages,
            tools: &specs,
            max_tokens: self.definition.max_tokens,
        };
        let mut span = self.model_call_span();
        let reply = model::complete_with_retries(self.model.as_ref(), &request, &self.runtime.retry).await;
        if let Some(mut span) = span.take() {
            match &reply {
                Ok(reply) => {
                    if let Some(usage) = reply.usage {
                        span.set("gen_ai.usage.input_tokens", usage.input_tokens as i64);
                        span.set("gen_ai.usage.output_tokens", usage.output_tokens as i64);
                    }
                    let finish = if reply.tool_calls.is_empty() { "stop" } else { "tool_calls" };
                    span.set_strings("gen_ai.response.finish_reasons", &[finish]);
                }
                Err(error) => span.fail("provider_error", error.to_string()),
            }
            span.end();
        }
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => return Step::Failed(error.to_string()),
        };
        transcript.model_calls += 1;
        match reply.usage {
            Some(reported) => *usage.get_or_insert_default() += reported,
            // A token budget it cannot count is not kept by guessing.
            None if budget.within(self.definition.budget()).max_total_tokens.is_some() => {
                return Step::Failed(
                    "budget exceeded: the provider reported no token usage, so the run's token budget cannot be kept."
                        .into(),
                );
            }
            None => {}
        }
        let text = reply.text.as_deref().unwrap_or_default();
        events.push(EventData::ModelResponded {
            text: EventText::new(text),
            tool_calls: reply.tool_calls.iter().map(|call| call.name.clone()).collect(),
            usage: reply.usage,
        });
        if !text.is_empty() {
            events.push(EventData::output(text));
        }
        if reply.tool_calls.is_empty() {
            let output = reply.text.clone().unwrap_or_default();
            // Kept unless this run's own turn alone is over the limit: then
            // what it last saved stays.
            let kept = transcript.ended_with(reply.text, self.runtime.max_checkpoint_bytes);
            return Step::Succeeded { output, transcript: kept.and_then(|kept| serde_json::to_value(kept).ok()) };
        }
        transcript.messages.push(Message::Assistant { text: reply.text, tool_calls: reply.tool_calls.clone() });
        // What the run may still put to people, in arguments kept with it;
        // room for one edit is always left.
        let proposals = MAX_APPROVAL_ARGUMENTS_PER_RUN - MAX_APPROVAL_ARGUMENTS_BYTES;
        let mut room = proposals.saturating_sub(approval_arguments_bytes(approvals));
        for call in reply.tool_calls {
            let mut logged = None;
            // Calls that cannot be made are answered at once, never put to a human.
            let refused = match self.checked(&tools, &call) {
                _ if self.asks_humans(&call) => match questions::asked(&call.arguments) {
                    // The schema is kept with the approval; the answer is
                    // held to the run's room when it is given.
                    Ok((_, schema)) if canonical_json(&schema).len() > room => Some(format!(
                        "This run has put as much to people as it may ({proposals} bytes as JSON); the question was not asked."
                    )),
                    Ok((_, schema)) => {
                        room -= canonical_json(&schema).len();
                        None
                    }
                    Err(problem) => Some(problem),
                },
                Ok((tool, arguments)) => {
                    // An approval keeps the arguments, whoever decides it.
                    let size = canonical_json(&arguments).len();
                    match self.verdict(tool, &arguments, policy) {
                        Verdict::Run { logged: matched } => {
                            logged = matched;
                            None
                        }
                        // A rule put to a person (or decided) a call of a
                        // tool that needs no approval: its numbers must
                        // read the same everywhere too.
                        _ if let Err(problem) = exact_canonical(&arguments) => {
                            Some(format!("The arguments cannot be put to a person: {problem}"))
                        }
                        // Too large to keep on an approval: denied all the same.
                        Verdict::Denied { policy, reason } if size > MAX_APPROVAL_ARGUMENTS_BYTES.min(room) => {
                            Some(denied_by(&policy.rule, reason.as_deref()))
                        }
                        _ if size > MAX_APPROVAL_ARGUMENTS_BYTES => Some(format!(
                            "The arguments are too long to put to a human reviewer (over {MAX_APPROVAL_ARGUMENTS_BYTES} bytes as JSON); the call was not made. Send shorter arguments."
                        )),
                        _ if size > room => Some(format!(
                            "This run has put as many arguments to human reviewers as it may ({proposals} bytes as JSON); the call was not made."
                        )),
                        _ => {
                            room -= size;
                            None
                        }
                    }
                }
                Err(problem) => Some(problem),
            };
            match refused {
                Some(content) => transcript.messages.push(Message::Tool { call_id: call.id, content, is_error: true }),
                None => {
                    let mcp_pin = tools.find(&call.name).and_then(|tool| tool.mcp.as_ref()).map(|mcp| mcp.pin.clone());
                    transcript.pending.push(PendingCall { call, approval: None, mcp_pin, logged });
                }
            }
        }
        // Judged in this step, under the policy the room above was
        // reckoned with.
        transcript.judged = true;
        let judging = Judging { first_approval: approvals.len(), policy, budget, usage: usage.as_ref() };
        if let Some(asked) = self.put_to_people(&tools, &mut transcript, judging, events) {
            return asked;
        }
        self.checkpoint(&mut transcript, events)
    }
}

#[async_trait]
impl Agent for LlmAgent {
    fn validate_input(&self, _input: &str) -> Result<(), String> {
        Ok(())
    }

    fn judges_calls(&self, checkpoint: Option<&serde_json::Value>) -> bool {
        // Read without decoding the transcript: the step asks the model
        // unless calls are pending, and calls pending from a checkpoint of
        // an earlier release are judged first.
        if self.specs.is_empty() && self.definition.mcp_servers.is_empty() {
            return false;
        }
        let Some(checkpoint) = checkpoint else { return true };
        let pending =
            checkpoint.get("pending").and_then(serde_json::Value::as_array).is_some_and(|pending| !pending.is_empty());
        !pending || checkpoint.get("judged") != Some(&serde_json::Value::Bool(true))
    }

    async fn step(&self, step: StepInput<'_>) -> Step {
        let mut transcript = match (step.checkpoint, step.carried) {
            (Some(checkpoint), _) => match serde_json::from_value::<Transcript>(checkpoint.clone()) {
                Ok(transcript) => transcript,
                Err(_) => return Step::Failed("The agent could not resume from its checkpoint.".into()),
            },
            (None, Some(carried)) => {
                let Ok(ended) = serde_json::from_value::<Transcript>(carried.clone()) else {
                    return Step::Failed("The conversation this run continues could not be read.".into());
                };
                let (transcript, dropped) = Transcript::continued(ended, step.input, self.runtime.max_checkpoint_bytes);
                if let Some(dropped) = dropped {
                    step.events.push(dropped.event());
                }
                transcript
            }
            (None, None) => Transcript::new(step.input),
        };
        if transcript.pending.is_empty() {
            return self.ask_model(step, transcript).await;
        }
        if !transcript.judged {
            transcript.judged = true;
            let tools = match self.toolbox().await {
                Ok(tools) => tools,
                Err(Unreachable(why)) => return Step::Failed(why),
            };
            let judging = Judging {
                first_approval: step.approvals.len(),
                policy: step.policy,
                budget: step.budget,
                usage: step.usage.as_ref(),
            };
            if let Some(asked) = self.put_to_people(&tools, &mut transcript, judging, step.events) {
                return asked;
            }
        }
        self.answer_pending(step, transcript).await
    }
}
