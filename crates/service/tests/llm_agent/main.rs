//! Defined LLM agents end to end through the worker and the real SQLite
//! store: against a local stand-in of an OpenAI-compatible provider and its
//! tools, and against Bedrock through the SDK's mock client.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use agent_runs_agents::AgentRegistry;
use agent_runs_agents::llm::{LlmRuntime, RetryPolicy};
use agent_runs_domain::{
    AgentDefinition, ApprovalKind, ApprovalStatus, Budget, Clock, Decision, DecisionRequest, ExecutionPolicy,
    IdGenerator, ManualClock, Owner, Run, RunId, RunStatus, Timestamp, Usage, canonical_json,
};
use agent_runs_embedded::LocalKey;
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::queue::RunMessage;
use agent_runs_ports::receipts::{Receipts, Signer};
use agent_runs_ports::store::{AgentStore, EventLog, RunStore};
use agent_runs_service::worker::{Outcome, Worker};
use agent_runs_testkit::faults::{Fault, FaultPlan, OnCalls};
use agent_runs_testkit::stand_in::{self, StandIn, Turn, text, tool_call};
use serde_json::{Value, json};
use tokio::sync::watch;

mod conversations;
mod mcp;
mod network;
mod policies;
mod questions;
mod receipts;
mod saves;
mod tool_calls;
mod veto;

const API_KEY: &str = "sk-test-secret-4f9a";
const ISSUER: &str = "https://runs.test";

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
        Self::signing_with(change, max_checkpoint_bytes, Arc::new(LocalKey::ephemeral().unwrap())).await
    }

    /// As [`Fixture::with`], with receipts signed by `signer`.
    async fn signing_with(
        change: impl FnOnce(&mut Value),
        max_checkpoint_bytes: usize,
        signer: Arc<dyn Signer>,
    ) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap();
        let stand_in = StandIn::start().await;
        let mut document = definition(&stand_in, &format!("{}/v1", stand_in.url));
        change(&mut document);
        let agent: AgentDefinition = serde_json::from_value(document).unwrap();
        store.put_agent(&agent.parse().unwrap(), Timestamp::from_millis(0)).await.unwrap();
        let env: HashMap<&str, &str> = HashMap::from([
            ("STAND_IN_KEY", API_KEY),
            ("DELETE_TOKEN", "Bearer tool-token"),
            ("ISSUES_TOKEN", "Bearer issues-token"),
        ]);
        let receipts = Receipts { signer, issuer: ISSUER.into() };
        let mut runtime =
            LlmRuntime::new(Arc::new(move |name| env.get(name).map(|value| value.to_string())), max_checkpoint_bytes)
                .with_receipts(receipts);
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
            .with_policies(Arc::new(self.store.clone()))
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
    page.events
        .into_iter()
        .map(|event| (event.kind.clone(), serde_json::from_str(&event.data_json(Default::default()).unwrap()).unwrap()))
        .collect()
}

/// The messages of the n-th model request.
fn messages(fixture: &Fixture, n: usize) -> Vec<Value> {
    fixture.stand_in.model_requests()[n]["messages"].as_array().unwrap().clone()
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
        let input = agent_runs_agents::llm::to_document(&json!({"branch": "old"}));
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
