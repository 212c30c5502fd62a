//! A defined agent's tool calls: harmless, gated, edited, rejected, over budget, malformed; its provider's failures.

use super::*;

#[tokio::test]
pub(super) async fn a_harmless_tool_call_then_an_answer() {
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
pub(super) async fn an_approved_call_waits_then_runs_exactly_once() {
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
pub(super) async fn an_edited_call_runs_once_with_the_edited_arguments_and_the_model_is_told() {
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
    assert_eq!(decided.1["decision"], "edit");
    assert_eq!(decided.1["arguments"], json!({"branch": "main"}));
}

#[tokio::test]
pub(super) async fn a_gated_call_too_long_to_show_a_person_is_answered_to_the_model() {
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
pub(super) async fn the_agents_token_budget_stops_the_run_before_a_call_past_it() {
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
pub(super) async fn a_runs_tool_call_budget_stops_it_at_the_next_call() {
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
pub(super) async fn nobody_is_asked_to_approve_a_call_the_budget_no_longer_allows() {
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
pub(super) async fn a_rejected_call_after_the_budget_is_spent_still_reaches_the_model() {
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
pub(super) async fn a_rejected_call_is_not_made_and_the_model_is_told_why() {
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
pub(super) async fn the_step_limit_fails_the_run_clearly() {
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
pub(super) async fn malformed_arguments_go_back_to_the_model_and_no_tool_is_called() {
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
pub(super) async fn an_approved_call_sends_the_tool_exactly_the_text_the_digest_covers() {
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
pub(super) async fn a_throttled_provider_is_retried_with_backoff() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![Turn::Fail(429, Some(1)), Turn::Fail(503, None), text("Done.")]);
    let message = fixture.create("Hello").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.output.as_deref(), Some("Done."));
    assert_eq!(fixture.stand_in.model_requests().len(), 3);
}

#[tokio::test]
pub(super) async fn a_provider_that_is_down_fails_the_run_without_leaking() {
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
pub(super) async fn a_refused_request_fails_at_once_without_the_key() {
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
pub(super) async fn a_transcript_over_the_limit_fails_the_run() {
    let fixture = Fixture::with(|_| {}, 8 * 1024).await;
    fixture.stand_in.script(vec![tool_call("call_1", "big", "{}"), text("never reached")]);
    let message = fixture.create("Fetch a lot").await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    let error = fixture.run(&message).await.error.unwrap();
    assert!(error.contains("over this deployment's limit of 8192 bytes"), "{error}");
}

#[tokio::test]
pub(super) async fn a_deleted_agent_fails_its_queued_runs() {
    let fixture = Fixture::new().await;
    let message = fixture.create("Hello").await;
    assert!(fixture.store.delete_agent("ops").await.unwrap());
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    assert_eq!(fixture.run(&message).await.error.as_deref(), Some("The agent `ops` is no longer configured."));
    assert!(fixture.agents.resolve("ops").await.unwrap().is_none());
}

// ---------------------------------------------------------------- where tools may go
