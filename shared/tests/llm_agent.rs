//! Defined LLM agents end to end through the worker and the real SQLite
//! store: against a local stand-in of an OpenAI-compatible provider and its
//! tools, and against Bedrock through the SDK's mock client.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use agent_runs_shared::agents::AgentRegistry;
use agent_runs_shared::agents::llm::{LlmRuntime, RetryPolicy};
use agent_runs_shared::domain::{
    AgentDefinition, ApprovalKind, ApprovalStatus, Budget, Clock, Decision, DecisionRequest, ExecutionPolicy,
    IdGenerator, ManualClock, Owner, Run, RunId, RunStatus, Timestamp, Usage, canonical_json,
};
use agent_runs_shared::queue::RunMessage;
use agent_runs_shared::store::{AgentStore, EventLog, RunStore};
use agent_runs_shared::worker::{Outcome, Worker};
use agent_runs_store_sqlite::{Durability, SqliteStore};
use agent_runs_testkit::faults::{Fault, FaultPlan, OnCalls};
use serde_json::{Value, json};
use support::stand_in::{self, StandIn, Turn, text, tool_call};
use tokio::sync::watch;

const API_KEY: &str = "sk-test-secret-4f9a";

struct Fixture {
    _dir: tempfile::TempDir,
    store: SqliteStore,
    clock: Arc<ManualClock>,
    policy: ExecutionPolicy,
    agents: AgentRegistry,
    ids: IdGenerator,
    stand_in: StandIn,
}

fn definition(stand_in: &StandIn, base_url: &str) -> Value {
    json!({
        "name": "ops",
        "provider": "openai",
        "model": "stand-in-1",
        "base_url": base_url,
        "api_key_env": "STAND_IN_KEY",
        "system_prompt": "You run operations.",
        "max_steps": 4,
        // The stand-in's tools listen on 127.0.0.1.
        "allow_private_network": true,
        "tools": [
            {
                "name": "lookup",
                "description": "Looks a ticket up.",
                "method": "GET",
                "url": format!("{}/tools/lookup", stand_in.url),
                "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"], "additionalProperties": false}
            },
            {
                "name": "delete_branch",
                "description": "Deletes a git branch.",
                "method": "POST",
                "url": format!("{}/tools/delete", stand_in.url),
                "headers_from_env": {"Authorization": "DELETE_TOKEN"},
                "requires_approval": true,
                "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}, "required": ["branch"]}
            },
            {
                "name": "big",
                "description": "Answers with a lot of text.",
                "method": "GET",
                "url": format!("{}/tools/big", stand_in.url),
                "max_response_bytes": 20000
            }
        ]
    })
}

fn running() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    std::mem::forget(sender);
    receiver
}

impl Fixture {
    async fn new() -> Fixture {
        Self::with(|_| {}, 256 * 1024).await
    }

    /// `change` edits the definition's JSON before it is stored.
    async fn with(change: impl FnOnce(&mut Value), max_checkpoint_bytes: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap();
        let stand_in = StandIn::start().await;
        let mut document = definition(&stand_in, &format!("{}/v1", stand_in.url));
        change(&mut document);
        let agent: AgentDefinition = serde_json::from_value(document).unwrap();
        store.put_agent(&agent.parse().unwrap(), Timestamp::from_millis(0)).await.unwrap();
        let env: HashMap<&str, &str> =
            HashMap::from([("STAND_IN_KEY", API_KEY), ("DELETE_TOKEN", "Bearer tool-token")]);
        let mut runtime =
            LlmRuntime::new(Arc::new(move |name| env.get(name).map(|value| value.to_string())), max_checkpoint_bytes);
        runtime.retry =
            RetryPolicy { attempts: 4, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(50) };
        let agents =
            AgentRegistry::with_defined("echo", Arc::new(store.clone()), Some(Arc::new(runtime)), Duration::ZERO);
        Fixture {
            _dir: dir,
            store,
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(1_795_303_478_123))),
            policy: ExecutionPolicy::default(),
            agents,
            ids: IdGenerator::default(),
            stand_in,
        }
    }

    fn worker(&self) -> Worker {
        Worker::new(Arc::new(self.store.clone()), self.agents.clone(), self.clock.clone(), self.policy.clone())
    }

    /// A worker whose store calls fail as `plan` says, under `policy`.
    fn faulty_worker(&self, plan: Arc<dyn FaultPlan>, policy: &ExecutionPolicy) -> Worker {
        let store = agent_runs_testkit::faults::Faults::store(Arc::new(self.store.clone()), plan);
        Worker::new(store, self.agents.clone(), self.clock.clone(), policy.clone())
    }

    async fn create(&self, input: &str) -> RunMessage {
        let id = RunId::from_ulid(self.ids.ulid_at(self.clock.now()));
        let owner = Owner::parse("acme").unwrap();
        let mut run = Run::new(id, owner.clone(), "ops".into(), input.into(), BTreeMap::new(), &self.policy);
        self.store.insert(&mut run, None, 1_000).await.unwrap();
        RunMessage { run_id: id, owner }
    }

    async fn run(&self, message: &RunMessage) -> Run {
        self.store.get(&message.owner, message.run_id).await.unwrap().unwrap()
    }

    async fn process(&self, message: &RunMessage) -> Outcome {
        self.worker().process(message, &running()).await.unwrap()
    }

    async fn decide(&self, message: &RunMessage, decision: Decision, comment: Option<&str>) {
        let mut run = self.run(message).await;
        let approval = run.approvals.last().unwrap().id;
        let request =
            DecisionRequest { decision, comment: comment.map(str::to_owned), seen_sha256: None, decided_by: None };
        run.decide(approval, request, self.clock.now(), &self.policy).unwrap();
        self.store.update(&mut run).await.unwrap();
        assert_eq!(run.status, RunStatus::Queued);
    }
}

/// The run's log: each event's type and data.
async fn events(fixture: &Fixture, message: &RunMessage) -> Vec<(String, Value)> {
    let page = fixture.store.events(message.run_id, 0, 1_000).await.unwrap();
    page.events.into_iter().map(|event| (event.kind, serde_json::from_str(&event.data).unwrap())).collect()
}

/// The messages of the n-th model request.
fn messages(fixture: &Fixture, n: usize) -> Vec<Value> {
    fixture.stand_in.model_requests()[n]["messages"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_harmless_tool_call_then_an_answer() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("OPS-7 is open.")]);
    let message = fixture.create("Is OPS-7 open?").await;

    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!(run.output.as_deref(), Some("OPS-7 is open."));
    assert_eq!(run.usage, Some(Usage { input_tokens: 20, output_tokens: 10, total_tokens: 30, tool_calls: 1 }));
    assert!(run.approvals.is_empty());

    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "GET");
    assert_eq!(calls[0].target, "/tools/lookup?id=OPS-7");
    assert_eq!(calls[0].idempotency_key, Some(format!("{}/call_1", message.run_id)));

    let first = &fixture.stand_in.model_requests()[0];
    assert_eq!(first["model"], "stand-in-1");
    assert_eq!(first["messages"][0], json!({"role": "system", "content": "You run operations."}));
    assert_eq!(first["messages"][1], json!({"role": "user", "content": "Is OPS-7 open?"}));
    assert_eq!(first["tools"].as_array().unwrap().len(), 3);
    assert_eq!(first["tools"][0]["function"]["name"], "lookup");
    let second = messages(&fixture, 1);
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(second[3]["tool_call_id"], "call_1");
    assert_eq!(serde_json::from_str::<Value>(second[3]["content"].as_str().unwrap()).unwrap()["ok"], true);
    // The API key went to the provider, and nowhere into the run.
    assert!(
        fixture.stand_in.model_authorization().iter().all(|auth| auth.as_deref() == Some("Bearer sk-test-secret-4f9a"))
    );
    assert!(!format!("{run:?}").contains(API_KEY));
    // The log tells the story: each model reply, the tool call and the answer.
    let log = events(&fixture, &message).await;
    let kinds: Vec<&str> = log.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run.created",
            "run.started",
            "model.responded",
            "tool.completed",
            "model.responded",
            "output.appended",
            "run.succeeded"
        ]
    );
    assert_eq!(log[2].1["tool_calls"], json!(["lookup"]));
    assert_eq!(log[2].1["usage"], json!({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}));
    let tool = &log[3].1;
    assert_eq!(
        (&tool["tool"], &tool["arguments"], &tool["http_status"]),
        (&json!("lookup"), &json!({"id": "OPS-7"}), &json!(200))
    );
    assert_eq!(serde_json::from_str::<Value>(tool["result"].as_str().unwrap()).unwrap()["ok"], true);
    assert_eq!((tool["truncated"].as_bool(), tool["duration_ms"].is_u64()), (Some(false), true));
    assert_eq!(log[4].1["text"], "OPS-7 is open.");
    assert_eq!(log[5].1, json!({"text": "OPS-7 is open.", "truncated": false}));
    assert!(!serde_json::to_string(&log).unwrap().contains(API_KEY), "no secret in the log");
}

#[tokio::test]
async fn an_approved_call_waits_then_runs_exactly_once() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#), text("Deleted old.")]);
    let message = fixture.create("Delete the branch old").await;

    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert_eq!(run.approvals.len(), 1);
    assert_eq!(run.approvals[0].action, r#"Call the tool `delete_branch` with {"branch":"old"}"#);
    assert!(fixture.stand_in.tool_calls().is_empty(), "nothing runs before the decision");
    // A duplicate message while it waits does nothing.
    assert_eq!(fixture.process(&message).await, Outcome::Dropped);

    fixture.decide(&message, Decision::Approve, None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.process(&message).await, Outcome::Dropped);

    let run = fixture.run(&message).await;
    assert_eq!(run.output.as_deref(), Some("Deleted old."));
    assert_eq!(run.approvals[0].status, ApprovalStatus::Approved);
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].method, "POST");
    assert_eq!(serde_json::from_str::<Value>(&calls[0].body).unwrap(), json!({"branch": "old"}));
    assert_eq!(calls[0].authorization.as_deref(), Some("Bearer tool-token"));
    assert_eq!(fixture.stand_in.model_requests().len(), 2);
    // Duplicate deliveries and the wait add no events: one call, one tool.completed.
    let log = events(&fixture, &message).await;
    let kinds: Vec<&str> = log.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run.created",
            "run.started",
            "model.responded",
            "approval.requested",
            "run.awaiting_approval",
            "approval.decided",
            "run.resumed",
            "run.started",
            "tool.completed",
            "model.responded",
            "output.appended",
            "run.succeeded"
        ]
    );
    assert_eq!(log[8].1["arguments"], json!({"branch": "old"}));
}

#[tokio::test]
async fn an_edited_call_runs_once_with_the_edited_arguments_and_the_model_is_told() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_3", "delete_branch", r#"{"branch": "main"}"#), text("Done.")]);
    let message = fixture.create("Delete a branch").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);

    let run = fixture.run(&message).await;
    let approval = &run.approvals[0];
    assert_eq!(approval.kind(), ApprovalKind::ToolCall);
    let call = approval.call.as_ref().unwrap();
    assert_eq!((call.tool.as_str(), &call.arguments), ("delete_branch", &json!({"branch": "main"})));
    // printf '%s' '{"branch":"main"}' | sha256sum
    assert_eq!(
        approval.arguments_sha256().as_deref(),
        Some("6461b20cebcb7034bd8b13089d21a90cf5ce300bd7d74eb625c7a342cf6ccdac")
    );

    fixture.decide(&message, Decision::Edit(json!({"branch": "old"})), None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.process(&message).await, Outcome::Dropped);

    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(serde_json::from_str::<Value>(&calls[0].body).unwrap(), json!({"branch": "old"}));
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals[0].status, ApprovalStatus::Approved);
    assert_eq!(run.approvals[0].edited_arguments, Some(json!({"branch": "old"})));
    let answer = &messages(&fixture, 1)[3];
    let content = answer["content"].as_str().unwrap();
    assert!(content.contains(r#"changed the arguments to {"branch":"old"}"#), "{content}");
    let log = events(&fixture, &message).await;
    let completed = log.iter().find(|(kind, _)| kind == "tool.completed").unwrap();
    assert_eq!(completed.1["arguments"], json!({"branch": "old"}));
    let decided = log.iter().find(|(kind, _)| kind == "approval.decided").unwrap();
    assert_eq!(decided.1["edited_arguments"], json!({"branch": "old"}));
    assert_eq!(decided.1["arguments"], json!({"branch": "main"}));
}

#[tokio::test]
async fn a_gated_call_too_long_to_show_a_person_is_answered_to_the_model() {
    let fixture = Fixture::new().await;
    let long = format!(r#"{{"branch": "{}"}}"#, "b".repeat(9 * 1024));
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", &long), text("I will not.")]);
    let message = fixture.create("Delete it").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert!(fixture.run(&message).await.approvals.is_empty(), "nobody was asked");
    assert!(fixture.stand_in.tool_calls().is_empty());
    let answer = messages(&fixture, 1)[3]["content"].as_str().unwrap().to_owned();
    assert!(answer.contains("too long to put to a human reviewer"), "{answer}");
}

#[tokio::test]
async fn the_agents_token_budget_stops_the_run_before_a_call_past_it() {
    // Each stand-in reply reports 15 tokens: the second brings the run to
    // 30, past 20, so its tool call is not made, nor any model call after.
    let fixture = Fixture::with(|document| document["max_total_tokens"] = json!(20), 256 * 1024).await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id":"1"}"#),
        tool_call("call_2", "lookup", r#"{"id":"2"}"#),
        text("never asked"),
    ]);
    let message = fixture.create("Look twice").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let run = fixture.run(&message).await;
    assert_eq!(run.error.as_deref(), Some("budget exceeded: the run used 30 tokens of its 20."));
    assert_eq!(fixture.stand_in.model_requests().len(), 2);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    assert_eq!(run.usage.map(|usage| (usage.total_tokens, usage.tool_calls)), Some((30, 1)));
}

#[tokio::test]
async fn a_runs_tool_call_budget_stops_it_at_the_next_call() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id":"1"}"#),
        tool_call("call_2", "lookup", r#"{"id":"2"}"#),
        text("never asked"),
    ]);
    let message = fixture.create("Look twice").await;
    let mut run = fixture.run(&message).await;
    run.budget = Budget { max_total_tokens: None, max_tool_calls: Some(1) };
    fixture.store.update(&mut run).await.unwrap();
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let run = fixture.run(&message).await;
    assert_eq!(run.error.as_deref(), Some("budget exceeded: the run made 1 tool calls of its 1."));
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    assert_eq!(fixture.stand_in.model_requests().len(), 2);
}

#[tokio::test]
async fn nobody_is_asked_to_approve_a_call_the_budget_no_longer_allows() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#)]);
    let message = fixture.create("Delete old").await;
    let mut run = fixture.run(&message).await;
    run.budget = Budget { max_total_tokens: None, max_tool_calls: Some(0) };
    fixture.store.update(&mut run).await.unwrap();
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let run = fixture.run(&message).await;
    assert!(run.approvals.is_empty(), "{:?}", run.approvals);
    assert_eq!(run.error.as_deref(), Some("budget exceeded: the run made 0 tool calls of its 0."));
}

#[tokio::test]
async fn a_rejected_call_after_the_budget_is_spent_still_reaches_the_model() {
    // Two gated calls in one turn, a budget of one call: the approved one is
    // made, the rejected one costs nothing, and the model is told and answers.
    let fixture = Fixture::new().await;
    let two_calls = stand_in::reply(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "delete_branch", "arguments": "{\"branch\":\"a\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "delete_branch", "arguments": "{\"branch\":\"b\"}"}}
    ]}));
    fixture.stand_in.script(vec![two_calls, text("Deleted a, kept b.")]);
    let message = fixture.create("Delete a and b").await;
    let mut run = fixture.run(&message).await;
    run.budget = Budget { max_total_tokens: None, max_tool_calls: Some(1) };
    fixture.store.update(&mut run).await.unwrap();
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let mut run = fixture.run(&message).await;
    let (first, second) = (run.approvals[0].id, run.approvals[1].id);
    let ask = |decision| DecisionRequest { decision, comment: None, seen_sha256: None, decided_by: None };
    run.decide(first, ask(Decision::Approve), fixture.clock.now(), &fixture.policy).unwrap();
    run.decide(second, ask(Decision::Reject), fixture.clock.now(), &fixture.policy).unwrap();
    fixture.store.update(&mut run).await.unwrap();
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!(run.output.as_deref(), Some("Deleted a, kept b."));
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    assert_eq!(run.usage.map(|usage| usage.tool_calls), Some(1));
}

#[tokio::test]
async fn a_rejected_call_is_not_made_and_the_model_is_told_why() {
    let fixture = Fixture::new().await;
    fixture
        .stand_in
        .script(vec![tool_call("call_1", "delete_branch", r#"{"branch":"main"}"#), text("Understood, main stays.")]);
    let message = fixture.create("Clean up").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Reject, Some("never delete main")).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    assert!(fixture.stand_in.tool_calls().is_empty());
    let answer = &messages(&fixture, 1)[3];
    assert_eq!(answer["role"], "tool");
    let content = answer["content"].as_str().unwrap();
    assert!(content.contains("rejected") && content.contains("never delete main"), "{content}");
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Understood, main stays."));
}

#[tokio::test]
async fn the_step_limit_fails_the_run_clearly() {
    let fixture = Fixture::new().await;
    let turns: Vec<Turn> = (0..6).map(|n| tool_call(&format!("call_{n}"), "lookup", r#"{"id":"1"}"#)).collect();
    fixture.stand_in.script(turns);
    let message = fixture.create("Loop forever").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let run = fixture.run(&message).await;
    assert_eq!(run.error.as_deref(), Some("The agent reached its limit of 4 model calls without a final answer."));
    assert_eq!(fixture.stand_in.model_requests().len(), 4);
    assert_eq!(fixture.stand_in.tool_calls().len(), 4);
}

#[tokio::test]
async fn malformed_arguments_go_back_to_the_model_and_no_tool_is_called() {
    let fixture = Fixture::with(|document| document["max_steps"] = json!(6), 256 * 1024).await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", "{not json"),
        tool_call("call_2", "lookup", r#"{"id": 7}"#),
        tool_call("call_3", "delete_branch", r#"{}"#),
        tool_call("call_4", "no_such_tool", r#"{}"#),
        tool_call("call_5", "delete_branch", r#"{"branch": "old", "account": 12345678901234567891}"#),
        text("I give up."),
    ]);
    let message = fixture.create("Look up ticket 7").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("I give up."));
    assert!(fixture.stand_in.tool_calls().is_empty());
    assert!(fixture.run(&message).await.approvals.is_empty(), "an invalid gated call is never put to a human");
    let feedback: Vec<String> =
        (1..4).map(|n| messages(&fixture, n).last().unwrap()["content"].as_str().unwrap().to_owned()).collect();
    assert!(feedback[0].contains("not valid JSON"), "{}", feedback[0]);
    assert!(feedback[1].contains("schema") && feedback[1].contains("/id"), "{}", feedback[1]);
    assert!(feedback[2].contains("schema") && feedback[2].contains("branch"), "{}", feedback[2]);
    // A number a browser would read as another is never put to a person.
    let inexact = messages(&fixture, 5).last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(inexact.contains("12345678901234567891") && inexact.contains("string"), "{inexact}");
}

/// The tool receives the approved arguments as the text the digest covers
/// (RFC 8785), digit for digit: what the person was shown and approved.
#[tokio::test]
async fn an_approved_call_sends_the_tool_exactly_the_text_the_digest_covers() {
    let fixture = Fixture::new().await;
    let proposed = r#"{"branch": "old", "retries": 2.0, "tiny": 1.5e-300, "ratio": 0.5e-6}"#;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", proposed), text("Done.")]);
    let message = fixture.create("Delete a branch").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    let canonical = canonical_json(&run.approvals[0].call.as_ref().unwrap().arguments);
    assert_eq!(canonical, r#"{"branch":"old","ratio":5e-7,"retries":2,"tiny":1.5e-300}"#);
    fixture.decide(&message, Decision::Approve, None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body, canonical);
}

#[tokio::test]
async fn a_throttled_provider_is_retried_with_backoff() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![Turn::Fail(429, Some(1)), Turn::Fail(503, None), text("Done.")]);
    let message = fixture.create("Hello").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Done."));
    assert_eq!(fixture.stand_in.model_requests().len(), 3);
}

#[tokio::test]
async fn a_provider_that_is_down_fails_the_run_without_leaking() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let fixture =
        Fixture::with(|document| document["base_url"] = json!(format!("http://{closed}/v1")), 256 * 1024).await;
    let message = fixture.create("Hello").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let error = fixture.run(&message).await.error.unwrap();
    assert!(error.contains("unavailable after 4 attempts"), "{error}");
    assert!(!error.contains(&closed.port().to_string()) && !error.contains("127.0.0.1"), "{error}");
}

#[tokio::test]
async fn a_refused_request_fails_at_once_without_the_key() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![Turn::Fail(401, None), text("never reached")]);
    let message = fixture.create("Hello").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let error = fixture.run(&message).await.error.unwrap();
    assert!(error.contains("HTTP 401"), "{error}");
    assert!(!error.contains(API_KEY));
    assert_eq!(fixture.stand_in.model_requests().len(), 1, "a 401 is not retried");
}

#[tokio::test]
async fn a_transcript_over_the_limit_fails_the_run() {
    let fixture = Fixture::with(|_| {}, 8 * 1024).await;
    fixture.stand_in.script(vec![tool_call("call_1", "big", "{}"), text("never reached")]);
    let message = fixture.create("Fetch a lot").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let error = fixture.run(&message).await.error.unwrap();
    assert!(error.contains("over this deployment's limit of 8192 bytes"), "{error}");
}

#[tokio::test]
async fn a_deleted_agent_fails_its_queued_runs() {
    let fixture = Fixture::new().await;
    let message = fixture.create("Hello").await;
    assert!(fixture.store.delete_agent("ops").await.unwrap());
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    assert_eq!(fixture.run(&message).await.error.as_deref(), Some("The agent `ops` is no longer configured."));
    assert!(fixture.agents.resolve("ops").await.unwrap().is_none());
}

// ---------------------------------------------------------------- where tools may go

const NOT_PUBLIC: &str =
    "The tool's address is not allowed: it resolves to a private or local network address. The call was not made.";

/// What the model was told about its first tool call (the last message of
/// the second model request).
fn first_tool_result(fixture: &Fixture) -> String {
    let sent = messages(fixture, 1);
    let result = sent.last().unwrap();
    assert_eq!(result["role"], "tool", "{result}");
    result["content"].as_str().unwrap().to_owned()
}

/// Runs one `lookup` call of an agent whose `lookup` tool is at `url`,
/// without the private network opt-in, and returns what the model was told.
async fn lookup_without_the_opt_in(url: impl FnOnce(&StandIn) -> String) -> (Fixture, String) {
    let stand_in = StandIn::start().await;
    let url = url(&stand_in);
    let fixture = Fixture::with(
        |document| {
            document.as_object_mut().unwrap().remove("allow_private_network");
            document["tools"][0]["url"] = json!(url);
        },
        256 * 1024,
    )
    .await;
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("Could not look it up.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Could not look it up."));
    let told = first_tool_result(&fixture);
    // The tool server that was named got nothing.
    assert!(stand_in.tool_calls().is_empty(), "{:?}", stand_in.tool_calls());
    (fixture, told)
}

#[tokio::test]
async fn without_the_opt_in_a_tool_on_a_loopback_address_is_refused_and_never_called() {
    let (fixture, told) = lookup_without_the_opt_in(|tools| format!("{}/tools/lookup", tools.url)).await;
    assert_eq!(told, NOT_PUBLIC);
    assert!(fixture.stand_in.tool_calls().is_empty());
    // Nothing about the address itself reaches the model.
    let port = fixture.stand_in.url.rsplit(':').next().unwrap().to_owned();
    assert!(!told.contains("127.0.0.1") && !told.contains(&port), "{told}");
}

#[tokio::test]
async fn without_the_opt_in_metadata_localhost_and_mapped_loopback_addresses_are_refused() {
    let port = |tools: &StandIn| tools.url.rsplit(':').next().unwrap().to_owned();
    let (_, told) =
        lookup_without_the_opt_in(|_| "http://169.254.169.254/latest/meta-data/iam/security-credentials/".into()).await;
    assert_eq!(told, NOT_PUBLIC, "the metadata endpoint");
    let (_, told) = lookup_without_the_opt_in(|tools| format!("http://localhost:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "localhost");
    let (_, told) =
        lookup_without_the_opt_in(|tools| format!("http://[::ffff:127.0.0.1]:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "IPv4-mapped loopback");
    let (_, told) = lookup_without_the_opt_in(|tools| format!("http://127.1:{}/tools/lookup", port(tools))).await;
    assert_eq!(told, NOT_PUBLIC, "a short form of 127.0.0.1");
}

/// The resolver itself, without the check of the URL in front of it: a name
/// that resolves only to this machine gets no connection.
#[tokio::test]
async fn the_tools_client_refuses_a_name_that_resolves_to_a_loopback_address() {
    use agent_runs_shared::public_network::NotPublic;
    let stand_in = StandIn::start().await;
    let port = stand_in.url.rsplit(':').next().unwrap().to_owned();
    let runtime = LlmRuntime::new(Arc::new(|_| None), 256 * 1024);
    let http = runtime.tool_http(false);
    assert!(http.public_only);
    let error = http.client.get(format!("http://localhost:{port}/tools/lookup")).send().await.unwrap_err();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut refused = false;
    while let Some(cause) = source {
        refused |= cause.downcast_ref::<NotPublic>().is_some();
        source = cause.source();
    }
    assert!(refused, "{}", agent_runs_shared::error_chain(&error));
    assert!(stand_in.tool_calls().is_empty());
    // The client for definitions that opt in connects.
    let allowed = runtime.tool_http(true);
    assert!(!allowed.public_only);
    let response = allowed.client.get(format!("http://localhost:{port}/tools/lookup")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(stand_in.tool_calls().len(), 1);
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_secret_header_goes_nowhere_else() {
    // The opt-in is on (both servers are local): redirects are refused anyway.
    let elsewhere = StandIn::start().await;
    let fixture = Fixture::with(
        |document| document["tools"][0]["headers_from_env"] = json!({"Authorization": "DELETE_TOKEN"}),
        256 * 1024,
    )
    .await;
    fixture.stand_in.redirect_tools_to(&format!("{}/tools/lookup", elsewhere.url));
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("It moved.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].authorization.as_deref(), Some("Bearer tool-token"));
    assert!(elsewhere.tool_calls().is_empty(), "the redirect was followed: {:?}", elsewhere.tool_calls());
    let told = first_tool_result(&fixture);
    assert!(told.starts_with("The tool answered HTTP 302") && told.contains("redirect"), "{told}");
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("It moved."));
}

#[tokio::test]
async fn with_the_opt_in_a_tool_on_a_loopback_address_is_called() {
    let fixture = Fixture::new().await;
    assert!(fixture.stand_in.url.starts_with("http://127.0.0.1:"));
    fixture.stand_in.script(vec![tool_call("call_1", "lookup", r#"{"id":"OPS-7"}"#), text("Open.")]);
    let message = fixture.create("Is OPS-7 open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    let told: Value = serde_json::from_str(&first_tool_result(&fixture)).unwrap();
    assert_eq!(told["ok"], true);
}

mod bedrock {
    use aws_sdk_bedrockruntime::Client;
    use aws_sdk_bedrockruntime::operation::converse::{ConverseError, ConverseOutput};
    use aws_sdk_bedrockruntime::types::error::ThrottlingException;
    use aws_sdk_bedrockruntime::types::{
        ContentBlock, ConversationRole, ConverseOutput as Output, Message, StopReason, TokenUsage, ToolUseBlock,
    };
    use aws_smithy_mocks::{RuleMode, mock, mock_client};

    use super::*;

    fn answer(content: ContentBlock, stop: StopReason) -> ConverseOutput {
        let message = Message::builder().role(ConversationRole::Assistant).content(content).build().unwrap();
        ConverseOutput::builder()
            .output(Output::Message(message))
            .stop_reason(stop)
            .usage(TokenUsage::builder().input_tokens(100).output_tokens(20).total_tokens(120).build().unwrap())
            .build()
            .unwrap()
    }

    fn tool_use() -> ConverseOutput {
        let input = agent_runs_shared::agents::llm::to_document(&json!({"branch": "old"}));
        let block =
            ToolUseBlock::builder().tool_use_id("tooluse_1").name("delete_branch").input(input).build().unwrap();
        answer(ContentBlock::ToolUse(block), StopReason::ToolUse)
    }

    async fn fixture(client: Client) -> Fixture {
        let mut fixture = Fixture::with(
            |document| {
                let object = document.as_object_mut().unwrap();
                object.insert("provider".into(), json!("bedrock"));
                object.insert("model".into(), json!("anthropic.claude-test"));
                object.remove("base_url");
                object.remove("api_key_env");
            },
            256 * 1024,
        )
        .await;
        let mut runtime = LlmRuntime::new(Arc::new(|name| (name == "DELETE_TOKEN").then(|| "t".into())), 256 * 1024)
            .with_bedrock(client);
        runtime.retry =
            RetryPolicy { attempts: 3, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(20) };
        fixture.agents = AgentRegistry::with_defined(
            "echo",
            Arc::new(fixture.store.clone()),
            Some(Arc::new(runtime)),
            Duration::ZERO,
        );
        fixture
    }

    #[tokio::test]
    async fn an_approved_tool_call_through_converse() {
        let asks_for_tool = mock!(Client::converse)
            .match_requests(|request| {
                request.model_id() == Some("anthropic.claude-test")
                    && request.messages().len() == 1
                    && request.tool_config().is_some_and(|tools| tools.tools().len() == 3)
            })
            .then_output(tool_use);
        // The second call carries the tool's result in a user turn.
        let answers = mock!(Client::converse)
            .match_requests(|request| {
                let messages = request.messages();
                messages.len() == 3
                    && messages[2].role() == &ConversationRole::User
                    && matches!(&messages[2].content()[0], ContentBlock::ToolResult(result) if result.tool_use_id() == "tooluse_1")
            })
            .then_output(|| answer(ContentBlock::Text("Deleted old.".into()), StopReason::EndTurn));
        let client = mock_client!(aws_sdk_bedrockruntime, RuleMode::MatchAny, [&asks_for_tool, &answers]);
        let fixture = fixture(client).await;
        let message = fixture.create("Delete old").await;

        assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
        assert_eq!(
            fixture.run(&message).await.approvals[0].action,
            r#"Call the tool `delete_branch` with {"branch":"old"}"#
        );
        fixture.decide(&message, Decision::Approve, None).await;
        assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

        let run = fixture.run(&message).await;
        assert_eq!(run.output.as_deref(), Some("Deleted old."));
        assert_eq!(run.usage, Some(Usage { input_tokens: 200, output_tokens: 40, total_tokens: 240, tool_calls: 1 }));
        assert_eq!((asks_for_tool.num_calls(), answers.num_calls()), (1, 1));
        assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    }

    #[tokio::test]
    async fn throttling_is_retried_and_a_validation_error_is_not() {
        let throttled_then_answers = mock!(Client::converse)
            .sequence()
            .error(|| ConverseError::ThrottlingException(ThrottlingException::builder().message("slow down").build()))
            .output(|| answer(ContentBlock::Text("Fine.".into()), StopReason::EndTurn))
            .build();
        let client = mock_client!(aws_sdk_bedrockruntime, RuleMode::Sequential, [&throttled_then_answers]);
        let fixture = fixture(client).await;
        let message = fixture.create("Hello").await;
        assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
        assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Fine."));
        assert_eq!(throttled_then_answers.num_calls(), 2);

        let refused = mock!(Client::converse).then_error(|| {
            ConverseError::ValidationException(
                aws_sdk_bedrockruntime::types::error::ValidationException::builder()
                    .message("arn:aws:bedrock:secret-internal-detail")
                    .build(),
            )
        });
        let client = mock_client!(aws_sdk_bedrockruntime, RuleMode::Sequential, [&refused]);
        let fixture = super::bedrock::fixture(client).await;
        let message = fixture.create("Hello").await;
        assert_eq!(fixture.process(&message).await, Outcome::Failed);
        let error = fixture.run(&message).await.error.unwrap();
        assert!(error.contains("Bedrock refused the request (ValidationException)"), "{error}");
        assert!(!error.contains("secret-internal-detail"), "{error}");
        assert_eq!(refused.num_calls(), 1);
    }
}

/// Fails the first store write made after the tool server received a call:
/// the save of the tool's result.
struct FailTheSaveAfterTheToolCall {
    stand_in: StandIn,
    fired: std::sync::atomic::AtomicBool,
}

impl agent_runs_testkit::faults::FaultPlan for FailTheSaveAfterTheToolCall {
    fn next(&self, operation: &'static str) -> agent_runs_testkit::faults::Fault {
        use std::sync::atomic::Ordering;
        let after_the_call = operation == "update" && !self.stand_in.tool_calls().is_empty();
        if after_the_call && !self.fired.swap(true, Ordering::SeqCst) {
            agent_runs_testkit::faults::Fault::FailBefore
        } else {
            agent_runs_testkit::faults::Fault::None
        }
    }
}

#[tokio::test]
async fn an_approved_call_whose_result_cannot_be_saved_once_is_still_made_exactly_once() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#), text("Deleted old.")]);
    let message = fixture.create("Delete the branch old").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Approve, None).await;

    let plan = Arc::new(FailTheSaveAfterTheToolCall { stand_in: fixture.stand_in.clone(), fired: Default::default() });
    let worker = fixture.faulty_worker(plan.clone(), &fixture.policy);
    // The save fails: the worker hands the run back with the tool's result.
    assert!(worker.process(&message, &running()).await.is_err());
    assert!(plan.fired.load(std::sync::atomic::Ordering::SeqCst));
    let run = fixture.run(&message).await;
    assert_eq!(run.status, RunStatus::Queued, "handed back, not left to a lease that must expire");
    assert_eq!(run.attempts, 0, "a failing store does not use up an attempt");

    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Deleted old."));
    assert_eq!(fixture.stand_in.tool_calls().len(), 1, "the tool is called exactly once");
    assert_eq!(fixture.stand_in.model_requests().len(), 2);
}

#[tokio::test]
async fn a_park_that_cannot_be_written_hands_the_run_back_as_it_was_before_the_step() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#), text("Deleted old.")]);
    let message = fixture.create("Delete the branch old").await;

    // Updates: the claim, the save of the model's answer, then the park.
    let plan = OnCalls::nth("update", 3, Fault::FailBefore);
    let worker = fixture.faulty_worker(plan, &fixture.policy);
    assert!(worker.process(&message, &running()).await.is_err());
    let run = fixture.run(&message).await;
    assert_eq!(run.status, RunStatus::Queued, "handed back");
    assert!(run.approvals.is_empty());

    // The retry asks for the approval again rather than fail for want of it.
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Approve, None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1, "the tool is called exactly once");
    assert_eq!(fixture.stand_in.model_requests().len(), 2, "the park's step asks no model");
}

#[tokio::test]
async fn a_step_whose_lease_lapsed_here_is_given_up_unless_it_reached_a_tool() {
    let fixture = Fixture::new().await;
    let policy = ExecutionPolicy { lease: Duration::from_millis(300), ..fixture.policy.clone() };
    // A slow model answer while no heartbeat gets through: another worker
    // may have the run once the lease lapsed, so this one gives up.
    fixture.stand_in.script(vec![text("Done.")]);
    fixture.stand_in.delay_model(Duration::from_secs(20));
    let message = fixture.create("Say done").await;
    let started = std::time::Instant::now();
    let worker = fixture.faulty_worker(OnCalls::from("update", 2, Fault::FailBefore), &policy);
    let outcome = worker.process(&message, &running()).await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "given up long before the model answered");

    // A tool call in flight is let finish even so: its outcome is wanted.
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#), text("Deleted old.")]);
    let message = fixture.create("Delete the branch old").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Approve, None).await;
    fixture.stand_in.delay_tools(Duration::from_millis(1_500));
    let worker = fixture.faulty_worker(OnCalls::from("update", 2, Fault::FailBefore), &policy);
    let started = std::time::Instant::now();
    assert!(worker.process(&message, &running()).await.is_err(), "the result cannot be saved");
    assert!(started.elapsed() >= Duration::from_millis(1_500), "the tool's answer was waited for");
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
}

#[tokio::test]
async fn a_stop_lets_a_tool_call_in_flight_end_and_records_its_result() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#), text("Deleted old.")]);
    fixture.stand_in.delay_tools(Duration::from_millis(600));
    let message = fixture.create("Delete the branch old").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Approve, None).await;

    let (stop, stopped) = watch::channel(false);
    let worker = fixture.worker();
    let stopping = async {
        // Stop while the tool is answering.
        while fixture.stand_in.tool_calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
    };
    let (outcome, ()) = tokio::join!(worker.process(&message, &stopped), stopping);
    assert_eq!(outcome.unwrap(), Outcome::Released);
    let run = fixture.run(&message).await;
    assert_eq!(run.status, RunStatus::Queued);
    let transcript = serde_json::to_string(&run.checkpoint).unwrap();
    assert!(transcript.contains("call_9") && transcript.contains(r#"\"ok\":true"#), "{transcript}");

    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1, "the tool is called exactly once");
}

#[tokio::test]
async fn a_model_that_never_answers_cannot_keep_the_run_past_its_time_limit() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![text("Too late.")]);
    fixture.stand_in.delay_model(Duration::from_secs(20));
    let message = fixture.create("Say something").await;
    let policy = ExecutionPolicy { max_run_time: Duration::from_millis(500), ..fixture.policy.clone() };
    let worker = Worker::new(Arc::new(fixture.store.clone()), fixture.agents.clone(), fixture.clock.clone(), policy);
    let started = std::time::Instant::now();
    assert_eq!(worker.process(&message, &running()).await.unwrap(), Outcome::Failed);
    assert!(started.elapsed() < Duration::from_secs(10), "failed at the limit, not when the model answered");
    let run = fixture.run(&message).await;
    assert!(run.error.as_deref().unwrap_or_default().contains("time limit"), "{:?}", run.error);
}

/// The model's last answer is reported with the run's end, not before: when
/// that write fails and the run is handed back, the answer asked for again
/// is the only one in the log.
#[tokio::test]
async fn a_final_answer_whose_write_failed_is_logged_once() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![text("First try."), text("Second try.")]);
    let message = fixture.create("Say something").await;
    // Updates: the claim, then the write that ends the run.
    let worker = fixture.faulty_worker(OnCalls::nth("update", 2, Fault::FailBefore), &fixture.policy);
    assert!(worker.process(&message, &running()).await.is_err());
    assert_eq!(fixture.run(&message).await.status, RunStatus::Queued, "handed back");
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    let log = events(&fixture, &message).await;
    let kinds: Vec<&str> = log.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "run.created",
            "run.started",
            "run.requeued",
            "run.started",
            "model.responded",
            "output.appended",
            "run.succeeded"
        ]
    );
    assert_eq!(log[5].1["text"], "Second try.");
}
