//! The owner's approval policy deciding a defined agent's tool calls: what
//! a rule denied never runs and the model is told why; what a rule allowed
//! runs without a person; both leave an approval resolved by the rule.

use super::*;
use agent_runs_domain::{Effect, KeyId, Resolver, RuleMode, parse_rules};
use agent_runs_ports::store::{PolicyStore, StoreError};
use agent_runs_testkit::stand_in::reply;

async fn put_policy(fixture: &Fixture, rules: Value) {
    let rules = parse_rules(&json!({ "rules": rules })).unwrap();
    let key = KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    let owner = Owner::parse("acme").unwrap();
    fixture.store.put_policy(&owner, None, &rules, fixture.clock.now(), key).await.unwrap().unwrap();
}

fn two_deletes() -> Turn {
    reply(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "delete_branch", "arguments": r#"{"branch": "main"}"#}},
        {"id": "call_2", "type": "function", "function": {"name": "delete_branch", "arguments": r#"{"branch": "feature/x"}"#}}
    ]}))
}

#[tokio::test]
pub(super) async fn rules_decide_calls_without_a_person_and_say_so_on_the_record() {
    let fixture = Fixture::new().await;
    put_policy(
        &fixture,
        json!([
            {"id": "protect-main", "tool": "delete_branch", "effect": "deny", "reason": "main is protected",
             "when": [{"path": "/branch", "op": "==", "value": "main"}]},
            {"id": "feature-branches", "tool": "delete_*", "effect": "allow",
             "when": [{"path": "/branch", "op": "prefix", "value": "feature/"}]},
        ]),
    )
    .await;
    fixture.stand_in.script(vec![two_deletes(), text("Deleted feature/x; main is protected.")]);
    let message = fixture.create("Delete main and feature/x").await;

    assert_eq!(fixture.process(&message).await, Outcome::Succeeded, "no one was asked");
    let run = fixture.run(&message).await;
    let decided: Vec<(ApprovalStatus, Option<String>)> = run
        .approvals
        .iter()
        .map(|approval| (approval.status, approval.resolved_by.as_ref().map(ToString::to_string)))
        .collect();
    assert_eq!(
        decided,
        [
            (ApprovalStatus::Rejected, Some("policy:protect-main".into())),
            (ApprovalStatus::Approved, Some("policy:feature-branches".into()))
        ]
    );
    let named = run.approvals[0].policy.clone().unwrap();
    assert_eq!(
        (named.rule.as_str(), named.effect, named.mode, named.version),
        ("protect-main", Effect::Deny, RuleMode::Enforce, 1)
    );
    assert_eq!(run.approvals[0].resolved_at, Some(run.approvals[0].requested_at));
    // The denied call never reached the tool; the allowed one did, once.
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&calls[0].body).unwrap(), json!({"branch": "feature/x"}));
    // The model was told why.
    let second = messages(&fixture, 1);
    let told: Vec<&str> = second
        .iter()
        .filter(|message| message["role"] == "tool")
        .filter_map(|message| message["content"].as_str())
        .collect();
    assert_eq!(told[0], "denied by policy protect-main: main is protected");
    // The audit trail: each decision requested and decided, by the rule.
    let log = events(&fixture, &message).await;
    let approvals: Vec<(&str, &Value)> = log
        .iter()
        .filter(|(kind, _)| kind.starts_with("approval."))
        .map(|(kind, data)| (kind.as_str(), &data["resolved_by"]))
        .collect();
    assert_eq!(
        approvals,
        [
            ("approval.requested", &Value::Null),
            ("approval.decided", &json!("policy:protect-main")),
            ("approval.requested", &Value::Null),
            ("approval.decided", &json!("policy:feature-branches")),
        ]
    );
    let decided = &log.iter().find(|(kind, _)| kind == "approval.decided").unwrap().1;
    assert_eq!(decided["policy"], json!({"rule": "protect-main", "effect": "deny", "mode": "enforce", "version": 1}));
    assert_eq!(decided["decision"], "reject", "a deny rule's decision");
    assert!(!log.iter().any(|(kind, _)| kind == "run.awaiting_approval"));
}

/// A log_only rule never decides; the approval a person decides records
/// what it would have done. An ask rule puts a call the tool would have
/// run to a person.
#[tokio::test]
pub(super) async fn log_only_rules_are_recorded_and_ask_rules_gate_any_tool() {
    let fixture = Fixture::new().await;
    put_policy(
        &fixture,
        json!([
            {"id": "would-allow", "tool": "delete_branch", "effect": "allow", "mode": "log_only"},
            {"id": "ask-lookups", "tool": "lookup", "effect": "ask", "when": [{"path": "/id", "op": "matches", "value": "SEC-[0-9]+"}]},
        ]),
    )
    .await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "delete_branch", r#"{"branch": "old"}"#),
        tool_call("call_2", "lookup", r#"{"id": "SEC-9"}"#),
        text("Done."),
    ]);
    let message = fixture.create("Delete old, then look SEC-9 up").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    let first = &run.approvals[0];
    assert_eq!((first.status, first.resolved_by.as_ref()), (ApprovalStatus::Pending, None));
    let named = first.policy.clone().unwrap();
    assert_eq!((named.rule.as_str(), named.effect, named.mode), ("would-allow", Effect::Allow, RuleMode::LogOnly));
    fixture.decide(&message, Decision::Approve, None).await;
    // The lookup needs no approval of its own, but the rule asks.
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    assert_eq!(
        run.approvals[1].policy.as_ref().map(|policy| (policy.rule.as_str(), policy.effect)),
        Some(("ask-lookups", Effect::Ask))
    );
    assert_eq!(fixture.stand_in.tool_calls().len(), 1, "only the approved delete ran");
    fixture.decide(&message, Decision::Reject, Some("not now")).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    let third = messages(&fixture, 2);
    let told = third.last().unwrap()["content"].as_str().unwrap();
    assert!(told.contains("A human reviewer rejected this call") && told.contains("not now"), "{told}");
    let decided = fixture.run(&message).await;
    assert_eq!(decided.approvals[1].status, ApprovalStatus::Rejected);
    assert!(!matches!(decided.approvals[1].resolved_by, Some(Resolver::Policy(_))), "a person decided it");
}

/// A `log_only` rule on a tool that needs no approval decides nothing and
/// asks no one, but the call's `tool.completed` names it, with what it
/// would have done: a deny is seen on the calls it would stop.
#[tokio::test]
pub(super) async fn a_log_only_rule_leaves_a_trace_on_calls_no_one_is_asked_about() {
    let fixture = Fixture::new().await;
    put_policy(
        &fixture,
        json!([
            {"id": "enforced-elsewhere", "tool": "delete_*", "effect": "deny"},
            {"id": "would-deny", "tool": "lookup", "effect": "deny", "mode": "log_only", "when": [{"path": "/id", "op": "prefix", "value": "SEC-"}]},
        ]),
    )
    .await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id": "SEC-9"}"#),
        tool_call("call_2", "lookup", r#"{"id": "ENG-1"}"#),
        text("Done."),
    ]);
    let message = fixture.create("Look SEC-9 and ENG-1 up").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 2, "log_only decides nothing");
    assert!(fixture.run(&message).await.approvals.is_empty(), "and asks no one");
    let log = events(&fixture, &message).await;
    let traces: Vec<&Value> =
        log.iter().filter(|(kind, _)| kind == "tool.completed").map(|(_, data)| &data["policy"]).collect();
    assert_eq!(
        traces,
        [&json!({"rule": "would-deny", "effect": "deny", "mode": "log_only", "version": 1}), &Value::Null]
    );
}

/// A tool that always asks is never let through by a rule.
#[tokio::test]
pub(super) async fn a_tool_that_always_asks_is_never_allowed_by_a_rule() {
    let fixture = Fixture::with(|definition| definition["tools"][1]["always_ask"] = json!(true), 256 * 1024).await;
    put_policy(&fixture, json!([{"id": "all", "effect": "allow"}])).await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch": "feature/y"}"#), text("Done.")]);
    let message = fixture.create("Delete feature/y").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals[0].status, ApprovalStatus::Pending);
    assert_eq!(run.approvals[0].policy.as_ref().map(|policy| policy.effect), Some(Effect::Ask));
    assert!(fixture.stand_in.tool_calls().is_empty());
}

/// The policy is read before each of the model's turns: a document put
/// while the run works (here while its first tool call runs) decides the
/// next turn's calls, within the same claim.
#[tokio::test]
pub(super) async fn a_policy_put_during_a_run_applies_from_the_next_turn() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id": "SEC-1"}"#),
        tool_call("call_2", "lookup", r#"{"id": "SEC-2"}"#),
        text("Looked one up."),
    ]);
    fixture.stand_in.delay_tools(std::time::Duration::from_millis(300));
    let message = fixture.create("Look SEC-1 and SEC-2 up").await;
    let put_while_the_first_call_runs = async {
        while fixture.stand_in.tool_calls().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        put_policy(&fixture, json!([{"id": "no-lookups", "tool": "lookup", "effect": "deny", "reason": "frozen"}]))
            .await;
    };
    let (outcome, ()) = tokio::join!(fixture.process(&message), put_while_the_first_call_runs);
    assert_eq!(outcome, Outcome::Succeeded);
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "the second turn's call was denied: {calls:?}");
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals.len(), 1, "the first call needed no approval; the second was denied by the rule");
    assert_eq!(run.approvals[0].resolved_by.as_ref().map(ToString::to_string), Some("policy:no-lookups".into()));
    assert_eq!(run.approvals[0].policy.as_ref().map(|policy| policy.version), Some(1));
}

/// Counts the reads of the policy and the documents decoded, over the real
/// store.
struct CountedPolicies {
    store: agent_runs_embedded::SqliteStore,
    reads: std::sync::atomic::AtomicUsize,
    decoded: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl PolicyStore for CountedPolicies {
    async fn read_policy(
        &self,
        owner: &Owner,
        known: Option<u64>,
    ) -> Result<Option<agent_runs_domain::Policy>, StoreError> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let read = self.store.read_policy(owner, known).await?;
        self.decoded.fetch_add(usize::from(read.is_some()), std::sync::atomic::Ordering::SeqCst);
        Ok(read)
    }
    async fn put_policy(
        &self,
        owner: &Owner,
        expected: Option<u64>,
        rules: &[agent_runs_domain::Rule],
        at: Timestamp,
        by: KeyId,
    ) -> Result<Option<agent_runs_domain::Policy>, StoreError> {
        self.store.put_policy(owner, expected, rules, at, by).await
    }
    async fn decided_calls(
        &self,
        owner: &Owner,
        limit: usize,
    ) -> Result<Vec<agent_runs_domain::DecidedCall>, StoreError> {
        self.store.decided_calls(owner, limit).await
    }
}

/// The policy costs one read per model turn, not per call, and its
/// document is decoded (its patterns compiled) once per process while its
/// version stays.
#[tokio::test]
pub(super) async fn the_policy_is_read_once_per_turn_and_decoded_once_per_version() {
    let fixture = Fixture::new().await;
    put_policy(
        &fixture,
        json!([{"id": "ask-sec", "tool": "lookup", "effect": "ask",
        "when": [{"path": "/id", "op": "matches", "value": "SEC-[0-9]+"}]}]),
    )
    .await;
    let three_lookups = || {
        reply(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": r#"{"id": "T-1"}"#}},
            {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": r#"{"id": "T-2"}"#}},
            {"id": "call_3", "type": "function", "function": {"name": "lookup", "arguments": r#"{"id": "T-3"}"#}}
        ]}))
    };
    fixture.stand_in.script(vec![three_lookups(), text("Three found."), three_lookups(), text("Again.")]);
    let counted = Arc::new(CountedPolicies {
        store: fixture.store.clone(),
        reads: Default::default(),
        decoded: Default::default(),
    });
    let worker = Worker::new(
        Arc::new(fixture.store.clone()),
        fixture.agents.clone(),
        fixture.clock.clone(),
        fixture.policy.clone(),
    )
    .with_policies(counted.clone());
    let count = |counter: &std::sync::atomic::AtomicUsize| counter.load(std::sync::atomic::Ordering::SeqCst);

    let first = fixture.create("Look three up").await;
    assert_eq!(worker.process(&first, &running()).await.unwrap(), Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 3);
    assert_eq!((count(&counted.reads), count(&counted.decoded)), (2, 1), "two turns, three calls");

    let second = fixture.create("Look three up again").await;
    assert_eq!(worker.process(&second, &running()).await.unwrap(), Outcome::Succeeded);
    assert_eq!((count(&counted.reads), count(&counted.decoded)), (4, 1), "the same version is not decoded again");
}

/// A turn every call of which a rule decided is one write; should it fail,
/// the run goes back as it was before the turn, the model's lost reply not
/// in the log, and the retry asks again.
#[tokio::test]
pub(super) async fn a_rule_decided_turn_that_cannot_be_written_leaves_no_trace() {
    let fixture = Fixture::new().await;
    put_policy(&fixture, json!([{"id": "old-branches", "tool": "delete_branch", "effect": "allow"}])).await;
    let delete = || tool_call("call_1", "delete_branch", r#"{"branch": "old"}"#);
    fixture.stand_in.script(vec![delete(), delete(), text("Deleted old.")]);
    let message = fixture.create("Delete old").await;
    // Updates: the claim, then the turn with the rule's decision.
    let worker = fixture
        .faulty_worker(OnCalls::nth("update", 2, Fault::FailBefore), &fixture.policy)
        .with_policies(Arc::new(fixture.store.clone()));
    assert!(worker.process(&message, &running()).await.is_err());
    let run = fixture.run(&message).await;
    assert_eq!((run.status, run.approvals.len(), run.checkpoint.is_none()), (RunStatus::Queued, 0, true));
    assert!(!events(&fixture, &message).await.iter().any(|(kind, _)| kind == "model.responded"));

    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1);
    assert_eq!(fixture.stand_in.model_requests().len(), 3);
    let replies = events(&fixture, &message).await.into_iter().filter(|(kind, _)| kind == "model.responded").count();
    assert_eq!(replies, 2, "the reply that was lost is not in the log");
}

/// A checkpoint an earlier release saved right after the model asked for
/// calls (not yet judged, no `judged` mark) is judged, under the policy in
/// force, before any call is made.
#[tokio::test]
pub(super) async fn calls_left_unjudged_by_an_earlier_release_are_judged_first() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch": "main"}"#), text("Could not.")]);
    let message = fixture.create("Delete main").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let parked = fixture.run(&message).await;
    let mut earlier = parked.checkpoint.clone().unwrap();
    assert_eq!(earlier["judged"], true);
    earlier.as_object_mut().unwrap().remove("judged");
    earlier["pending"][0].as_object_mut().unwrap().remove("approval");

    // Another run, left by the earlier release with that checkpoint.
    let again = fixture.create("Delete main").await;
    let mut run = fixture.run(&again).await;
    let now = fixture.clock.now();
    run.claim("earlier", now, &fixture.policy).unwrap();
    run.release("earlier", Some(earlier), now, &fixture.policy).unwrap();
    fixture.store.update(&mut run).await.unwrap();
    put_policy(
        &fixture,
        json!([{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "reason": "protected"}]),
    )
    .await;

    assert_eq!(fixture.process(&again).await, Outcome::Succeeded);
    let run = fixture.run(&again).await;
    assert_eq!(run.approvals.len(), 1);
    assert_eq!(run.approvals[0].resolved_by.as_ref().map(ToString::to_string), Some("policy:protect-main".into()));
    assert!(fixture.stand_in.tool_calls().is_empty(), "the denied call never ran");
    assert_eq!(fixture.stand_in.model_requests().len(), 2, "the earlier release's turn was not asked again");
}
