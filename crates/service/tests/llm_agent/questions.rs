//! A defined agent with `ask_human = true` asks a person: the run parks on
//! a question (never decided by a rule), and the answer or the refusal is
//! the tool's result.

use super::*;
use agent_runs_domain::{ApprovalKind, ApprovalStatus, KeyId, parse_rules};
use agent_runs_ports::store::PolicyStore;

fn ask(id: &str, arguments: Value) -> Turn {
    tool_call(id, "ask_human", &arguments.to_string())
}

#[tokio::test]
pub(super) async fn the_model_asks_a_person_and_reads_the_answer() {
    let fixture = Fixture::with(|definition| definition["ask_human"] = json!(true), 256 * 1024).await;
    // A rule that would deny any tool does not touch questions.
    let rules = parse_rules(&json!({"rules": [{"id": "nothing", "tool": "*", "effect": "deny"}]})).unwrap();
    let key = KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    fixture.store.put_policy(&Owner::parse("acme").unwrap(), None, &rules, fixture.clock.now(), key).await.unwrap();
    let schema = json!({"enum": ["staging", "prod"]});
    fixture.stand_in.script(vec![
        // A schema that is not one: the model is told, no one is asked.
        ask("call_0", json!({"question": "Where?", "answer_schema": {"type": 7}})),
        ask("call_1", json!({"question": "Which environment?", "answer_schema": schema})),
        ask("call_2", json!({"question": "Why?"})),
        text("Deploying to staging."),
    ]);
    let message = fixture.create("Deploy").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let told = messages(&fixture, 1);
    let refusal = told.last().unwrap()["content"].as_str().unwrap();
    assert!(refusal.contains("not a valid JSON Schema"), "{refusal}");
    let tools = fixture.stand_in.model_requests()[0]["tools"].clone();
    assert!(tools.as_array().unwrap().iter().any(|tool| tool["function"]["name"] == "ask_human"), "{tools}");

    let run = fixture.run(&message).await;
    assert_eq!(run.approvals.len(), 1);
    let question = &run.approvals[0];
    assert_eq!((question.kind(), question.action.as_str()), (ApprovalKind::Input, "Which environment?"));
    assert_eq!((question.input_schema.as_ref(), question.resolved_by.as_ref()), (Some(&schema), None));
    fixture.decide(&message, Decision::Answer(json!("staging")), None).await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let answered = messages(&fixture, 2);
    assert_eq!(answered.last().unwrap()["content"], "staging");
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals[1].input_schema, Some(json!({"type": "string"})));
    fixture.decide(&message, Decision::Reject, Some("ask the release manager")).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let declined = messages(&fixture, 3);
    let content = declined.last().unwrap()["content"].as_str().unwrap();
    assert!(content.contains("declined") && content.contains("release manager"), "{content}");
    let run = fixture.run(&message).await;
    assert_eq!(
        run.approvals.iter().map(|a| a.status).collect::<Vec<_>>(),
        [ApprovalStatus::Answered, ApprovalStatus::Rejected]
    );
    assert!(fixture.stand_in.tool_calls().is_empty(), "asking is not an HTTP tool call");
    assert_eq!(run.usage.map(|usage| usage.tool_calls), Some(0));
}

/// A definition may not both ask humans and have a tool of that name.
#[tokio::test]
pub(super) async fn ask_human_is_a_reserved_tool_name() {
    let stand_in = StandIn::start().await;
    let mut document = definition(&stand_in, "http://127.0.0.1:9/v1");
    document["ask_human"] = json!(true);
    document["tools"][0]["name"] = json!("ask_human");
    let agent: AgentDefinition = serde_json::from_value(document).unwrap();
    assert!(agent.parse().unwrap_err().to_string().contains("ask_human"));
}
