//! The state machine, transition by transition: every legal move and every
//! refused one.

use std::collections::BTreeMap;
use std::time::Duration;

use ulid::Ulid;

use agent_runs_domain::{
    ApprovalId, ApprovalRequest, ApprovalStatus, Changed, ClaimOutcome, ClaimRefused, DecideOutcome, Decision,
    DecisionRequest, EventData, ExecutionPolicy, Owner, Run, RunId, RunStatus, SweepAction, Timestamp, TransitionError,
    time_limit_message,
};

mod tool_calls;

const T0: i64 = 1_795_303_478_123;

fn at(offset_ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + offset_ms)
}

fn policy() -> ExecutionPolicy {
    ExecutionPolicy::default()
}

/// The types of the run's events not yet written, oldest first.
fn kinds(run: &Run) -> Vec<&'static str> {
    run.pending_events.iter().map(|event| event.data.kind()).collect()
}

fn approval_id(n: u128) -> ApprovalId {
    ApprovalId::from_ulid(Ulid::from_parts(T0 as u64, n))
}

fn ask(decision: Decision, comment: Option<String>) -> DecisionRequest {
    DecisionRequest { decision, comment, seen_sha256: None, decided_by: None }
}

fn queued() -> Run {
    let id = RunId::from_ulid(Ulid::from_parts(T0 as u64, 1));
    Run::new(id, Owner::parse("acme").unwrap(), "script".into(), "say hi".into(), BTreeMap::new(), &policy())
}

fn running() -> Run {
    let mut run = queued();
    assert_eq!(run.claim("w1", at(10), &policy()), Ok(ClaimOutcome::Claimed));
    run
}

fn awaiting(actions: usize) -> Run {
    let mut run = running();
    let requests =
        (0..actions).map(|n| (approval_id(n as u128 + 1), ApprovalRequest::action(format!("action {n}")))).collect();
    run.park("w1", requests, serde_json::json!({"next": 1}), at(20), &policy()).unwrap();
    run
}

fn succeeded() -> Run {
    let mut run = running();
    run.succeed("w1", "out".into(), None, at(30)).unwrap();
    run
}

fn failed() -> Run {
    let mut run = running();
    run.fail("w1", "boom".into(), at(30)).unwrap();
    run
}

fn canceled() -> Run {
    let mut run = queued();
    run.cancel(at(5)).unwrap();
    run
}

fn every_state() -> Vec<Run> {
    vec![queued(), running(), awaiting(1), succeeded(), failed(), canceled()]
}

#[test]
fn a_new_run_is_queued_with_its_creation_time_from_the_id() {
    let run = queued();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.created_at, at(0));
    assert_eq!(run.due_at, Some(at(0).plus(policy().requeue_after)));
    assert!(run.started_at.is_none() && run.completed_at.is_none() && run.output.is_none());
}

#[test]
fn claim_moves_queued_to_running_with_a_lease() {
    let run = running();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.started_at, Some(at(10)));
    assert_eq!(run.attempts, 1);
    let lease = run.lease.clone().unwrap();
    assert_eq!(lease.worker, "w1");
    assert_eq!(lease.expires_at, at(10).plus(policy().lease));
    assert_eq!(run.due_at, Some(lease.expires_at));
}

#[test]
fn claim_is_refused_while_a_lease_is_live_and_allowed_once_it_expired() {
    let mut run = running();
    assert_eq!(run.claim("w2", at(11), &policy()), Err(ClaimRefused::LeaseHeld));
    assert_eq!(run.claim("w1", at(11), &policy()), Err(ClaimRefused::LeaseHeld), "no re-entry by a duplicate");
    let expired = at(10).plus(policy().lease);
    assert_eq!(run.claim("w2", expired, &policy()), Ok(ClaimOutcome::Claimed));
    assert_eq!(run.attempts, 2);
    assert_eq!(run.started_at, Some(at(10)), "started_at keeps the first pick-up");
    assert!(run.held_by("w2") && !run.held_by("w1"));
}

#[test]
fn an_expired_lease_may_be_taken_over_by_the_same_holder_name() {
    // Leases are per claim; a name seen again after expiry is a new claim
    // (a warm Lambda container whose earlier attempt died), never a reason
    // to drop the run forever.
    let mut run = running();
    let expired = at(10).plus(policy().lease);
    assert_eq!(run.claim("w1", expired, &policy()), Ok(ClaimOutcome::Claimed));
    assert_eq!(run.attempts, 2);
}

#[test]
fn claim_fails_the_run_once_attempts_are_used_up() {
    let mut run = queued();
    let mut now = at(0);
    for attempt in 1..=policy().max_attempts {
        assert_eq!(run.claim(&format!("w{attempt}"), now, &policy()), Ok(ClaimOutcome::Claimed));
        now = now.plus(policy().lease);
    }
    assert_eq!(run.claim("last", now, &policy()), Ok(ClaimOutcome::AttemptsExhausted));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("3 attempts"));
    assert_eq!(run.completed_at, Some(now));
    assert_eq!(run.due_at, None);
}

#[test]
fn claim_is_refused_for_awaiting_and_terminal_runs() {
    assert_eq!(awaiting(1).claim("w2", at(50), &policy()), Err(ClaimRefused::AwaitingApproval));
    for mut run in [succeeded(), failed(), canceled()] {
        let before = run.clone();
        assert_eq!(run.claim("w2", at(50), &policy()), Err(ClaimRefused::Terminal));
        assert_eq!(run, before);
    }
}

#[test]
fn only_the_lease_holder_may_finish_and_only_while_running() {
    for mut run in every_state() {
        let before = run.clone();
        let holder_may = run.status == RunStatus::Running;
        assert_eq!(run.clone().succeed("w1", "x".into(), None, at(40)).is_ok(), holder_may);
        assert_eq!(run.clone().fail("w1", "x".into(), at(40)).is_ok(), holder_may);
        assert_eq!(run.clone().heartbeat("w1", None, at(40), &policy()).is_ok(), holder_may);
        assert_eq!(run.clone().release("w1", None, at(40), &policy()).is_ok(), holder_may);
        assert_eq!(
            run.clone()
                .park("w1", vec![(approval_id(9), "a".into())], serde_json::Value::Null, at(40), &policy())
                .is_ok(),
            holder_may
        );
        assert_eq!(run.succeed("w2", "x".into(), None, at(40)), Err(TransitionError::LeaseLost));
        assert_eq!(run, before, "a refused transition changes nothing");
    }
}

#[test]
fn succeed_and_fail_are_terminal_with_completed_at() {
    let run = succeeded();
    assert_eq!((run.status, run.output.as_deref(), run.error.as_deref()), (RunStatus::Succeeded, Some("out"), None));
    assert_eq!(run.completed_at, Some(at(30)));
    assert!(run.lease.is_none() && run.due_at.is_none() && run.checkpoint.is_none());
    let run = failed();
    assert_eq!((run.status, run.output.as_deref(), run.error.as_deref()), (RunStatus::Failed, None, Some("boom")));
}

#[test]
fn completed_at_is_never_earlier_than_created_at() {
    let mut run = running();
    run.succeed("w1", String::new(), None, at(-5_000)).unwrap();
    assert_eq!(run.completed_at, Some(run.created_at));
    let mut run = queued();
    run.cancel(at(-5_000)).unwrap();
    assert_eq!(run.completed_at, Some(run.created_at));
}

#[test]
fn heartbeat_extends_the_lease_and_saves_progress() {
    let mut run = running();
    run.heartbeat("w1", Some(serde_json::json!({"step": 3})), at(1_000), &policy()).unwrap();
    assert_eq!(run.lease.as_ref().unwrap().expires_at, at(1_000).plus(policy().lease));
    assert_eq!(run.checkpoint, Some(serde_json::json!({"step": 3})));
}

#[test]
fn park_stores_pending_approvals_and_resets_attempts() {
    let run = awaiting(2);
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert_eq!(run.approvals.len(), 2);
    assert!(run.approvals.iter().all(|a| a.status == ApprovalStatus::Pending && a.requested_at == at(20)));
    assert_eq!(run.attempts, 0);
    assert!(run.lease.is_none());
    assert_eq!(run.checkpoint, Some(serde_json::json!({"next": 1})));
}

#[test]
fn release_requeues_without_using_an_attempt() {
    let mut run = running();
    run.release("w1", Some(serde_json::json!(7)), at(50), &policy()).unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.attempts, 0);
    assert_eq!(run.checkpoint, Some(serde_json::json!(7)));
    assert_eq!(run.due_at, Some(at(50).plus(policy().requeue_after)));
}

#[test]
fn cancel_from_each_state() {
    for mut run in every_state() {
        let from = run.status;
        let result = run.cancel(at(100));
        match from {
            RunStatus::Queued | RunStatus::Running | RunStatus::AwaitingApproval => {
                assert_eq!(result, Ok(Changed::Yes));
                assert_eq!(run.status, RunStatus::Canceled);
                assert_eq!(run.completed_at, Some(at(100)));
                assert!(run.lease.is_none() && run.due_at.is_none());
            }
            RunStatus::Canceled => assert_eq!(result, Ok(Changed::No)),
            RunStatus::Succeeded | RunStatus::Failed => assert_eq!(result, Err(TransitionError::InvalidState(from))),
        }
    }
}

#[test]
fn cancel_cancels_pending_approvals_but_keeps_decided_ones() {
    let mut run = awaiting(2);
    run.decide(approval_id(1), ask(Decision::Approve, None), at(30), &policy()).unwrap();
    run.cancel(at(40)).unwrap();
    assert_eq!(run.approvals[0].status, ApprovalStatus::Approved);
    assert_eq!(run.approvals[0].resolved_at, Some(at(30)));
    assert_eq!(run.approvals[1].status, ApprovalStatus::Canceled);
    assert_eq!(run.approvals[1].resolved_at, Some(at(40)));
}

#[test]
fn deciding_the_last_pending_approval_requeues_the_run() {
    let mut run = awaiting(2);
    assert_eq!(
        run.decide(approval_id(1), ask(Decision::Approve, Some("ok".into())), at(30), &policy()),
        Ok(DecideOutcome::Recorded)
    );
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert_eq!(run.approvals[0].comment.as_deref(), Some("ok"));
    assert_eq!(run.decide(approval_id(2), ask(Decision::Reject, None), at(31), &policy()), Ok(DecideOutcome::Requeued));
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.approvals[1].status, ApprovalStatus::Rejected);
    assert_eq!(run.approvals[1].resolved_at, Some(at(31)));
    assert_eq!(run.due_at, Some(at(31).plus(policy().requeue_after)));
}

#[test]
fn repeating_a_decision_is_unchanged_whatever_the_run_state() {
    let mut run = awaiting(1);
    run.decide(approval_id(1), ask(Decision::Approve, Some("first".into())), at(30), &policy()).unwrap();
    let mut done = run.clone();
    assert!(done.claim("w2", at(40), &policy()).is_ok());
    done.succeed("w2", "x".into(), None, at(50)).unwrap();
    for mut state in [run, done] {
        let before = state.clone();
        assert_eq!(
            state.decide(approval_id(1), ask(Decision::Approve, Some("again".into())), at(60), &policy()),
            Ok(DecideOutcome::Unchanged)
        );
        assert_eq!(state, before);
        assert_eq!(
            state.decide(approval_id(1), ask(Decision::Reject, None), at(60), &policy()),
            Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Approved))
        );
    }
}

#[test]
fn canceled_approvals_refuse_any_decision_and_unknown_ones_are_not_found() {
    let mut run = awaiting(1);
    run.cancel(at(30)).unwrap();
    for decision in [Decision::Approve, Decision::Reject] {
        assert_eq!(
            run.decide(approval_id(1), ask(decision, None), at(40), &policy()),
            Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Canceled))
        );
    }
    assert_eq!(
        run.decide(approval_id(99), ask(Decision::Approve, None), at(40), &policy()),
        Err(TransitionError::NoSuchApproval)
    );
}

#[test]
fn sweep_requeues_stale_queued_runs_and_recovers_expired_leases() {
    let mut run = queued();
    assert_eq!(run.sweep(at(1), &policy()), SweepAction::Nothing);
    let due = run.due_at.unwrap();
    assert_eq!(run.sweep(due, &policy()), SweepAction::Enqueue);
    assert_eq!(run.due_at, Some(due.plus(policy().requeue_after)));

    let mut run = running();
    let expiry = run.lease.as_ref().unwrap().expires_at;
    assert_eq!(run.sweep(expiry.plus(Duration::from_millis(1)), &policy()), SweepAction::Enqueue);
    assert_eq!(run.status, RunStatus::Running, "the next claim takes it over");

    let mut run = running();
    run.attempts = policy().max_attempts;
    let expiry = run.lease.as_ref().unwrap().expires_at;
    assert_eq!(run.sweep(expiry, &policy()), SweepAction::Failed);
    assert_eq!(run.status, RunStatus::Failed);

    for mut run in [succeeded(), failed(), canceled()] {
        let before = run.clone();
        assert_eq!(run.sweep(Timestamp::MAX, &policy()), SweepAction::Nothing);
        assert_eq!(run, before);
    }
}

#[test]
fn statuses_parse_from_their_wire_names() {
    for status in RunStatus::ALL {
        assert_eq!(RunStatus::parse(status.as_str()), Some(status));
    }
    assert_eq!(RunStatus::parse("Queued"), None);
    for status in [ApprovalStatus::Pending, ApprovalStatus::Approved, ApprovalStatus::Expired] {
        assert_eq!(ApprovalStatus::parse(status.as_str()), Some(status));
    }
    assert_eq!(RunStatus::ALL.iter().filter(|s| s.is_terminal()).count(), 3);
}

#[test]
fn parked_approvals_carry_their_deadline_and_the_sweeper_expires_them() {
    let mut run = awaiting(2);
    let deadline = at(20).plus(policy().approval_timeout);
    assert!(run.approvals.iter().all(|a| a.expires_at == Some(deadline)));
    let warning = Timestamp::from_millis(deadline.millis() - policy().approval_warning.as_millis() as i64);
    assert_eq!(run.due_at, Some(warning), "the sweeper looks first when the approvals are about to expire");
    let before = run.clone();
    assert_eq!(run.sweep(at(21), &policy()), SweepAction::Nothing);
    assert_eq!(run, before);

    // The warning: one approval.expiring each, once; then the expiry is due.
    run.take_events();
    assert_eq!(run.sweep(warning, &policy()), SweepAction::Warned);
    assert_eq!(kinds(&run), ["approval.expiring", "approval.expiring"]);
    assert!(run.approvals.iter().all(|approval| approval.expiry_warned && approval.status == ApprovalStatus::Pending));
    assert_eq!((run.due_at, run.status), (Some(deadline), RunStatus::AwaitingApproval));
    run.take_events();
    assert_eq!(run.sweep(warning, &policy()), SweepAction::Nothing, "warned once");

    run.decide(approval_id(1), ask(Decision::Approve, None), at(30), &policy()).unwrap();
    run.take_events();
    assert_eq!(run.sweep(deadline, &policy()), SweepAction::Failed);
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.approvals[0].status, ApprovalStatus::Approved, "decided approvals keep their decision");
    assert_eq!(run.approvals[1].status, ApprovalStatus::Expired);
    assert_eq!(run.approvals[1].resolved_at, Some(deadline));
    assert!(run.error.as_deref().unwrap().contains("action 1"), "{:?}", run.error);
    assert_eq!(run.completed_at, Some(deadline));
    assert_eq!(kinds(&run), ["approval.expired", "run.failed"]);
    // An expired approval cannot be decided any more.
    assert_eq!(
        run.decide(approval_id(2), ask(Decision::Approve, None), deadline, &policy()),
        Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Expired))
    );
}

#[test]
fn time_awaiting_approval_does_not_count_against_the_execution_limit() {
    let limit = policy().max_run_time;
    let mut run = queued();
    run.claim("w1", at(0), &policy()).unwrap();
    run.park("w1", vec![(approval_id(1), "a".into())], serde_json::Value::Null, at(1_000), &policy()).unwrap();
    assert_eq!(run.execution_time(at(999_999_999)), Duration::from_secs(1), "the clock stops while parked");
    let days_later = at(1_000).plus(policy().approval_timeout).plus(Duration::from_secs(1));
    run.decide(approval_id(1), ask(Decision::Approve, None), at(2_000), &policy()).unwrap();
    assert_eq!(run.claim("w2", days_later, &policy()), Ok(ClaimOutcome::Claimed));
    assert_eq!(run.execution_time(days_later.plus(limit / 2)), Duration::from_secs(1) + limit / 2);
}

#[test]
fn a_run_past_its_execution_limit_is_failed_at_its_next_claim() {
    let mut run = queued();
    run.claim("w1", at(0), &policy()).unwrap();
    run.release("w1", None, at(0).plus(policy().max_run_time), &policy()).unwrap();
    let later = at(0).plus(policy().max_run_time).plus(Duration::from_secs(1));
    assert_eq!(run.claim("w2", later, &policy()), Ok(ClaimOutcome::AttemptsExhausted));
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some(time_limit_message(policy().max_run_time).as_str()));
}

#[test]
fn a_taken_over_run_counts_the_dead_workers_time_up_to_its_last_heartbeat() {
    let mut run = running(); // claimed at 10
    run.heartbeat("w1", None, at(5_010), &policy()).unwrap();
    let expired = at(5_010).plus(policy().lease);
    run.claim("w2", expired, &policy()).unwrap();
    assert_eq!(run.execution_ms, 5_000);
    assert_eq!(run.running_since, Some(expired));
}

#[test]
fn a_dead_lettered_run_is_failed_only_if_it_is_stuck() {
    let mut run = queued();
    assert!(run.abandon(at(100)));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("queue message"));

    let mut live = running();
    assert!(!live.abandon(at(11)), "a live lease means a worker has it");
    let expiry = live.lease.as_ref().unwrap().expires_at;
    assert!(live.abandon(expiry));

    for mut run in [awaiting(1), succeeded(), failed(), canceled()] {
        let before = run.clone();
        assert!(!run.abandon(at(100)));
        assert_eq!(run, before);
    }
}

#[test]
fn a_queued_run_is_sent_again_ever_more_rarely_and_from_scratch_after_a_claim() {
    let mut run = queued();
    let minute = policy().requeue_after;
    let mut now = run.due_at.unwrap();
    let mut waits = Vec::new();
    for _ in 0..8 {
        assert_eq!(run.sweep(now, &policy()), SweepAction::Enqueue);
        let next = run.due_at.unwrap();
        waits.push(next.since(now).as_secs() / minute.as_secs());
        now = next;
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 32, 32]);
    run.claim("w1", now, &policy()).unwrap();
    run.release("w1", None, now, &policy()).unwrap();
    assert_eq!(run.due_at, Some(now.plus(minute)), "a new stretch of queued starts from one wait again");
    assert_eq!(run.sweep(now.plus(minute), &policy()), SweepAction::Enqueue);
    assert_eq!(run.due_at, Some(now.plus(minute).plus(minute)));
}

#[test]
fn a_decision_after_the_approval_expired_expires_it_instead() {
    let mut run = awaiting(1);
    let approval = run.approvals[0].clone();
    let expiry = approval.expires_at.unwrap();
    let before = Timestamp::from_millis(expiry.millis() - 1);
    assert!(!run.clone().expire_if_due(approval.id, before, &policy()), "still in time");
    assert!(run.expire_if_due(approval.id, expiry, &policy()));
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.approvals[0].status, ApprovalStatus::Expired);
    assert!(!run.expire_if_due(approval.id, expiry, &policy()), "only once");
}

#[test]
fn every_change_records_its_events_and_a_repeat_records_none() {
    let mut run = queued();
    assert_eq!(kinds(&run), ["run.created"]);
    let created = run.take_events();
    assert_eq!((created[0].seq, run.event_seq, run.pending_events.len()), (1, 1, 0));
    assert!(matches!(&created[0].data, EventData::RunCreated(shown) if shown.status == RunStatus::Queued));

    run.claim("w1", at(10), &policy()).unwrap();
    assert_eq!(kinds(&run), ["run.started"]);
    assert!(matches!(run.pending_events[0].data, EventData::RunStarted { attempt: 1 }));
    run.take_events();
    run.heartbeat("w1", None, at(11), &policy()).unwrap();
    assert!(kinds(&run).is_empty(), "a heartbeat changes no status");
    run.park(
        "w1",
        vec![(approval_id(1), "a".into()), (approval_id(2), "b".into())],
        serde_json::json!({}),
        at(20),
        &policy(),
    )
    .unwrap();
    assert_eq!(kinds(&run), ["approval.requested", "approval.requested", "run.awaiting_approval"]);
    let parked = run.take_events();
    assert_eq!(parked.iter().map(|event| event.seq).collect::<Vec<_>>(), [3, 4, 5]);
    assert!(
        matches!(&parked[2].data, EventData::RunAwaitingApproval { approval_ids } if approval_ids == &[approval_id(1), approval_id(2)])
    );

    run.decide(approval_id(1), ask(Decision::Approve, Some("ok".into())), at(30), &policy()).unwrap();
    assert_eq!(kinds(&run), ["approval.decided"]);
    run.take_events();
    assert_eq!(
        run.decide(approval_id(1), ask(Decision::Approve, None), at(31), &policy()),
        Ok(DecideOutcome::Unchanged)
    );
    assert!(kinds(&run).is_empty(), "a repeated decision records nothing");
    run.decide(approval_id(2), ask(Decision::Reject, None), at(32), &policy()).unwrap();
    assert_eq!(kinds(&run), ["approval.decided", "run.resumed"]);
    run.take_events();

    run.claim("w2", at(40), &policy()).unwrap();
    run.release("w2", None, at(41), &policy()).unwrap();
    assert_eq!(kinds(&run), ["run.started", "run.requeued"]);
    run.take_events();
    run.claim("w3", at(50), &policy()).unwrap();
    run.succeed("w3", "done".into(), None, at(60)).unwrap();
    assert_eq!(kinds(&run), ["run.started", "run.succeeded"]);
    assert!(
        matches!(&run.pending_events[1].data, EventData::RunSucceeded(shown) if shown.output.as_ref().map(|text| text.text.as_str()) == Some("done"))
    );
    run.take_events();
    assert_eq!(run.cancel(at(70)), Err(TransitionError::InvalidState(RunStatus::Succeeded)));
    assert!(kinds(&run).is_empty());

    let mut waiting = awaiting(2);
    waiting.take_events();
    waiting.cancel(at(80)).unwrap();
    assert_eq!(kinds(&waiting), ["approval.canceled", "approval.canceled", "run.canceled"]);
    waiting.take_events();
    assert_eq!(waiting.cancel(at(81)), Ok(Changed::No));
    assert!(kinds(&waiting).is_empty(), "a repeated cancel records nothing");
}

#[test]
fn a_claim_that_would_fill_the_log_fails_the_run_instead() {
    let small = ExecutionPolicy { max_events: 3, ..policy() };
    let mut run = queued();
    assert_eq!(run.claim("w1", at(10), &small), Ok(ClaimOutcome::Claimed), "room for run.started and the end");
    run.release("w1", None, at(11), &small).unwrap();
    assert_eq!(run.events_logged(), 3);
    assert_eq!(run.claim("w2", at(12), &small), Ok(ClaimOutcome::AttemptsExhausted));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("limit of 3 events"), "{:?}", run.error);
    // A hand-back took the last place: the end is recorded one past it.
    assert_eq!((kinds(&run).last(), run.events_logged()), (Some(&"run.failed"), 4));
}
