//! Answering the model's calls: each pending call is made once (an HTTP
//! tool's or an MCP server's), with the receipt of the approval that
//! allowed it, or told to the model as a person or a rule decided it.

use super::mcp::{self, McpSession};
use super::model::{Message, ToolCall};
use super::tools::{ToolHttp, ToolOutcome};
use super::transcript::{PendingCall, Transcript};
use super::{LlmAgent, asking, denied_by, questions, shorten};
use crate::{Step, StepInput};

use agent_runs_domain::{
    Approval, ApprovalRequest, ApprovalStatus, EventData, EventText, McpServerDefinition, PolicyMatch, Resolver,
    ToolCompleted, canonical_json,
};
use agent_runs_platform::telemetry::{self, Span, SpanKind};
use agent_runs_ports::receipts;

/// Why a tool call was not made.
enum NotMade {
    /// The run fails (an MCP server that cannot be used).
    Failed(String),
    /// The MCP tool changed since the call was judged: a person decides
    /// these arguments again.
    ToolChanged { pin: String, arguments: serde_json::Value },
}

impl LlmAgent {
    /// Answers the first pending call: runs it, or tells the model a human
    /// rejected it.
    pub(super) async fn answer_pending(&self, step: StepInput<'_>, mut transcript: Transcript) -> Step {
        let StepInput { run_id, approvals, usage, budget, must_finish, events, .. } = step;
        let run_id = &run_id.to_string();
        let pending = transcript.pending.remove(0);
        let call = &pending.call;
        // A question is told by its approval, whatever the definition says now.
        let question = pending.approval.and_then(|index| approvals.get(index)).filter(|a| a.input_schema.is_some());
        if question.is_some() || self.asks_humans(call) {
            let Some((content, is_error)) = question.and_then(questions::result) else {
                return Step::Failed("The question this run waited on is missing or unanswered.".into());
            };
            transcript.messages.push(Message::Tool { call_id: call.id.clone(), content, is_error });
            return self.checkpoint(&mut transcript, events);
        }
        let approval = pending.approval.map(|index| approvals.get(index));
        // `Some` when the call is to be made, with the approval that allowed it.
        let allowed = match approval {
            None => Some(None),
            Some(Some(approval)) if approval.status == ApprovalStatus::Approved => Some(Some(approval)),
            _ => None,
        };
        if allowed.is_some()
            && let Some(spent) = budget.within(self.definition.budget()).refuses_tool_call(usage.as_ref())
        {
            return Step::Failed(spent);
        }
        let outcome = match (allowed, approval) {
            (Some(allowed), _) => {
                let making = &mut Making { run_id, must_finish, usage, events: &mut *events };
                match self.run_tool(&pending, allowed, making).await {
                    Err(NotMade::Failed(why)) => return Step::Failed(why),
                    Err(NotMade::ToolChanged { pin, arguments }) => {
                        // Asked again, about the tool as its server has it now.
                        let request = ApprovalRequest { tool_changed: true, ..asking(&call.name, arguments) };
                        let again = PendingCall {
                            call: call.clone(),
                            approval: Some(approvals.len()),
                            mcp_pin: Some(pin),
                            logged: None,
                        };
                        transcript.pending.insert(0, again);
                        return match self.save(&mut transcript, events) {
                            Ok(checkpoint) => Step::AwaitApproval { requests: vec![request], checkpoint },
                            Err(failed) => failed,
                        };
                    }
                    Ok(outcome) => match allowed.and_then(|approval| approval.edited_arguments.as_ref()) {
                        None => outcome,
                        Some(edited) => ToolOutcome {
                            content: format!(
                                "A human reviewer changed the arguments to {} before the call was made. {}",
                                canonical_json(edited),
                                outcome.content
                            ),
                            ..outcome
                        },
                    },
                }
            }
            (None, Some(Some(approval))) if approval.status == ApprovalStatus::Rejected => {
                match &approval.resolved_by {
                    Some(Resolver::Policy(rule)) => ToolOutcome::error(denied_by(rule, approval.comment.as_deref())),
                    _ => {
                        let comment = approval
                            .comment
                            .as_deref()
                            .map(|comment| format!(" Their comment: {comment}"))
                            .unwrap_or_default();
                        ToolOutcome::error(format!("A human reviewer rejected this call; it was not made.{comment}"))
                    }
                }
            }
            _ => return Step::Failed("The approval this run waited for is missing or undecided.".into()),
        };
        transcript.messages.push(Message::Tool {
            call_id: call.id.clone(),
            content: outcome.content,
            is_error: outcome.is_error,
        });
        // Saved before anything else happens, so the call is not made twice.
        self.checkpoint(&mut transcript, events)
    }

    /// Makes the call once: an HTTP tool's is checked again first (the
    /// definition may have changed while it waited), with the arguments a
    /// person edited in place of the model's; an MCP tool's, see
    /// [`Self::run_mcp_tool`].
    async fn run_tool(
        &self,
        pending: &PendingCall,
        approval: Option<&Approval>,
        making: &mut Making<'_>,
    ) -> Result<ToolOutcome, NotMade> {
        let call = &pending.call;
        let http = self.runtime.tool_http(self.definition.allow_private_network);
        if let Some((server, _)) = self.definition.mcp_tool(&call.name) {
            return self.run_mcp_tool(server, &http, pending, approval, making).await;
        }
        let edited_call;
        let call = match approval.and_then(|approval| approval.edited_arguments.as_ref()) {
            Some(arguments) => {
                edited_call = ToolCall { arguments: arguments.to_string(), ..call.clone() };
                &edited_call
            }
            None => call,
        };
        let tools = self.http_tools();
        let (tool, arguments) = match self.checked(&tools, call) {
            Ok(checked) => checked,
            Err(problem) => return Ok(ToolOutcome::error(problem)),
        };
        let receipt = match approval {
            Some(approval) => {
                let call = receipts::Call {
                    audience: &tool.definition.url,
                    tool: &tool.definition.name,
                    mcp_server: None,
                    arguments: &arguments,
                };
                self.receipt(making.run_id, approval, &call).await?
            }
            None => None,
        };
        let idempotency_key = format!("{}/{}", making.run_id, call.id);
        let traced = ToolCallTrace::start(call, making);
        let outcome = tool.call(&http, &arguments, &idempotency_key, &self.runtime.env, receipt.as_deref()).await;
        traced.end(call, arguments, &outcome, None, pending.logged.clone(), making.events);
        Ok(outcome)
    }

    /// Calls an MCP tool once, in a session that lists the tools first:
    /// the server must still offer the tool as it did when the call was
    /// judged (else a person is asked again), and the arguments (the
    /// approval's, exactly, or the model's) must fit its input schema now.
    async fn run_mcp_tool(
        &self,
        server: &McpServerDefinition,
        http: &ToolHttp,
        pending: &PendingCall,
        approval: Option<&Approval>,
        making: &mut Making<'_>,
    ) -> Result<ToolOutcome, NotMade> {
        let call = &pending.call;
        // The receipt travels on every request of the session (the call's included).
        let receipt = match approval.and_then(|approval| Some((approval, approval.arguments_to_use()?))) {
            Some((approval, arguments)) => {
                let tool = self.definition.mcp_tool(&call.name).map_or(call.name.as_str(), |(_, tool)| tool);
                let sent = receipts::Call { audience: &server.url, tool, mcp_server: Some(&server.name), arguments };
                self.receipt(making.run_id, approval, &sent).await?
            }
            None => None,
        };
        let session = McpSession::open(server, http, &self.runtime.env, receipt.as_deref())
            .await
            .map_err(|why| NotMade::Failed(why.0))?;
        let listed = match session.list().await {
            Ok(listed) => listed,
            Err(why) => {
                session.close().await;
                return Err(NotMade::Failed(why.0));
            }
        };
        let tools = mcp::offered(server, listed);
        let Some(tool) = tools.iter().find(|tool| tool.definition.name == call.name) else {
            session.close().await;
            return Ok(ToolOutcome::error(format!("There is no tool named `{}`.", shorten(&call.name, 64))));
        };
        let binding = tool.mcp.as_ref().expect("an MCP server's tool");
        let arguments = match approval.and_then(Approval::arguments_to_use) {
            Some(arguments) => Ok(arguments.clone()),
            None => tool.check_arguments(&call.arguments),
        };
        if pending.mcp_pin.as_deref() != Some(binding.pin.as_str()) {
            session.close().await;
            return match arguments {
                Ok(arguments) => Err(NotMade::ToolChanged { pin: binding.pin.clone(), arguments }),
                Err(problem) => Ok(ToolOutcome::error(problem)),
            };
        }
        let arguments = match arguments.and_then(|arguments| tool.check_arguments(&arguments.to_string())) {
            Ok(arguments) => arguments,
            Err(problem) => {
                session.close().await;
                return Ok(ToolOutcome::error(problem));
            }
        };
        let traced = ToolCallTrace::start(call, making);
        let outcome = session.call(&binding.tool, &arguments).await;
        session.close().await;
        traced.end(call, arguments, &outcome, Some(&server.name), pending.logged.clone(), making.events);
        Ok(outcome)
    }

    /// The receipt of a call `approval` allowed, when this deployment
    /// signs them; a call whose receipt cannot be signed is not made.
    async fn receipt(
        &self,
        run_id: &str,
        approval: &Approval,
        call: &receipts::Call<'_>,
    ) -> Result<Option<String>, NotMade> {
        let Some(receipts) = &self.runtime.receipts else { return Ok(None) };
        match receipts
            .issue(run_id, approval, call, agent_runs_domain::Clock::now(&agent_runs_domain::SystemClock))
            .await
        {
            Ok(receipt) => Ok(Some(receipt)),
            Err(error) => {
                tracing::error!(error = %error, "an approval receipt could not be signed; the call was not made");
                Err(NotMade::Failed(
                    "The approval receipt of a tool call could not be signed, so the call was not made.".into(),
                ))
            }
        }
    }
}

/// What making a call touches of its step.
struct Making<'a> {
    run_id: &'a str,
    must_finish: &'a crate::MustFinish,
    usage: &'a mut Option<agent_runs_domain::Usage>,
    events: &'a mut Vec<EventData>,
}

/// A tool call being made: its span, and its event once it ends.
struct ToolCallTrace {
    started: std::time::Instant,
    span: Option<Span>,
}

impl ToolCallTrace {
    /// The call is about to be made: from here the step must finish (its
    /// outcome recorded), and it counts as one of the run's tool calls.
    fn start(call: &ToolCall, making: &mut Making<'_>) -> Self {
        making.must_finish.set();
        making.usage.get_or_insert_default().tool_calls += 1;
        let span = telemetry::current()
            .and_then(|parent| Span::child_of(parent, format!("execute_tool {}", call.name), SpanKind::Internal));
        ToolCallTrace { started: std::time::Instant::now(), span }
    }

    fn end(
        self,
        call: &ToolCall,
        arguments: serde_json::Value,
        outcome: &ToolOutcome,
        mcp_server: Option<&str>,
        policy: Option<PolicyMatch>,
        events: &mut Vec<EventData>,
    ) {
        if let Some(mut span) = self.span {
            span.set("gen_ai.operation.name", "execute_tool");
            span.set("gen_ai.tool.name", call.name.clone());
            span.set("gen_ai.tool.type", if mcp_server.is_some() { "extension" } else { "function" });
            span.set("gen_ai.tool.call.id", call.id.clone());
            if let Some(server) = mcp_server {
                span.set("mcp.server.name", server.to_owned());
            }
            if let Some(status) = outcome.http_status {
                span.set("http.response.status_code", i64::from(status));
            }
            if outcome.is_error {
                // An MCP tool's error is its own answer (`isError`).
                let answered = outcome.http_status.is_some() || mcp_server.is_some();
                let kind = if answered { "tool_error" } else { "no_response" };
                span.fail(kind, "the tool call failed");
            }
            span.end();
        }
        events.push(EventData::ToolCompleted(Box::new(ToolCompleted {
            tool: call.name.clone(),
            arguments,
            http_status: outcome.http_status,
            duration_ms: self.started.elapsed().as_millis() as u64,
            result: EventText::new(&outcome.content),
            mcp_server: mcp_server.map(str::to_owned),
            policy,
        })));
    }
}
