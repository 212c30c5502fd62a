//! Veto windows: a gated call whose tool sets `auto_approve_after_secs`
//! is approved as `timeout` by the sweeper when the window ends, unless a
//! person decided first; the call is then made once.

use agent_runs_domain::Resolver;
use agent_runs_ports::queue::{InProcessQueue, RunQueue};
use agent_runs_service::worker::Sweeper;

use super::*;

async fn fixture() -> Fixture {
    Fixture::with(|definition| definition["tools"][1]["auto_approve_after_secs"] = json!(900), 256 * 1024).await
}

#[tokio::test]
async fn nobody_objects_and_the_sweeper_approves_the_call_when_the_window_ends() {
    let fixture = fixture().await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#), text("Deleted old.")]);
    let message = fixture.create("Delete old").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let asked = fixture.clock.now();
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals[0].auto_approves_at, Some(asked.plus(Duration::from_secs(900))));

    let (queue, receiver) = InProcessQueue::new();
    let queue: Arc<dyn RunQueue> = Arc::new(queue);
    let sweeper = Sweeper::new(Arc::new(fixture.store.clone()), queue, fixture.clock.clone(), fixture.policy.clone());
    fixture.clock.advance(Duration::from_secs(899));
    let report = sweeper.sweep().await.unwrap();
    assert_eq!((report.enqueued, report.auto_approved), (0, 0), "{report:?}");
    assert_eq!(fixture.run(&message).await.approvals[0].status, ApprovalStatus::Pending);
    fixture.clock.advance(Duration::from_secs(1));
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 1);
    let run = fixture.run(&message).await;
    let approval = &run.approvals[0];
    assert_eq!((approval.status, approval.resolved_by.as_ref()), (ApprovalStatus::Approved, Some(&Resolver::Timeout)));
    assert_eq!(run.status, RunStatus::Queued);
    let decided: Vec<Value> = events(&fixture, &message)
        .await
        .into_iter()
        .filter(|(kind, _)| kind == "approval.decided")
        .map(|e| e.1)
        .collect();
    assert_eq!(decided.len(), 1);
    assert_eq!((&decided[0]["resolved_by"], &decided[0]["decision"]), (&json!("timeout"), &json!("timeout")));

    assert_eq!(receiver.receive().await.unwrap(), message);
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 1, "the call, once");
    let claims = super::receipts::claims(calls[0].receipt.as_deref().unwrap());
    assert_eq!((claims["decision"].as_str(), claims["decided_by"].as_str()), (Some("timeout"), Some("timeout")));
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 0);
}

#[tokio::test]
async fn a_veto_before_the_window_ends_rejects_the_call() {
    let fixture = fixture().await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch":"main"}"#), text("Left it.")]);
    let message = fixture.create("Delete main").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.clock.advance(Duration::from_secs(600));
    fixture.decide(&message, Decision::Reject, Some("never main")).await;
    fixture.clock.advance(Duration::from_secs(600));
    let (queue, _receiver) = InProcessQueue::new();
    let sweeper =
        Sweeper::new(Arc::new(fixture.store.clone()), Arc::new(queue), fixture.clock.clone(), fixture.policy.clone());
    sweeper.sweep().await.unwrap();
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!(run.approvals[0].status, ApprovalStatus::Rejected);
    assert!(fixture.stand_in.tool_calls().is_empty());
}
