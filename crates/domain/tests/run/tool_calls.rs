//! Decisions on gated tool calls: bound to the exact arguments, edits,
//! extensions and expiry.

use std::time::Duration;

use super::{approval_id, ask, at, awaiting, kinds, policy, running};
use agent_runs_domain::{
    ApprovalId, ApprovalKind, ApprovalRequest, ApprovalStatus, Changed, DecideOutcome, Decision, DecisionRequest,
    Effect, EventData, MAX_APPROVAL_ARGUMENTS_PER_RUN, PolicyMatch, ProposedCall, Resolver, RuleDecision, RuleMode,
    Run, RunStatus, SweepAction, Timestamp, TransitionError,
};

fn awaiting_tool_call() -> Run {
    let mut run = running();
    let request = ApprovalRequest::call(
        "Call the tool `deploy`",
        ProposedCall { tool: "deploy".into(), arguments: serde_json::json!({"env": "prod", "version": 7}) },
    );
    run.park("w1", vec![(approval_id(1), request)], serde_json::json!({}), at(20), &policy()).unwrap();
    run
}

fn edit(arguments: serde_json::Value) -> DecisionRequest {
    ask(Decision::Edit(arguments), None)
}

#[test]
fn a_decision_for_other_arguments_changes_nothing() {
    let mut run = awaiting_tool_call();
    let digest = run.approvals[0].arguments_sha256().unwrap();
    let before = run.clone();
    let stale = DecisionRequest { seen_sha256: Some("0".repeat(64)), ..ask(Decision::Approve, None) };
    assert_eq!(run.decide(approval_id(1), stale, at(30), &policy()), Err(TransitionError::ArgumentsChanged));
    assert_eq!(run, before);
    let bound = DecisionRequest { seen_sha256: Some(digest), ..ask(Decision::Approve, None) };
    assert_eq!(run.decide(approval_id(1), bound, at(30), &policy()), Ok(DecideOutcome::Requeued));
}

#[test]
fn an_edit_approves_with_the_new_arguments_and_repeats_only_as_itself() {
    let mut run = awaiting_tool_call();
    let edited = serde_json::json!({"env": "staging", "version": 7});
    assert_eq!(run.decide(approval_id(1), edit(edited.clone()), at(30), &policy()), Ok(DecideOutcome::Requeued));
    let approval = &run.approvals[0];
    assert_eq!((approval.status, approval.edited_arguments.as_ref()), (ApprovalStatus::Approved, Some(&edited)));
    assert_eq!(approval.arguments_to_use(), Some(&edited));
    assert_eq!(approval.call.as_ref().unwrap().arguments["env"], "prod", "what was proposed stays on record");
    assert_eq!(run.decide(approval_id(1), edit(edited), at(31), &policy()), Ok(DecideOutcome::Unchanged));
    // The same value written otherwise (as a store reads `7.0` back as `7`).
    let rewritten = serde_json::json!({"version": 7.0, "env": "staging"});
    assert_eq!(run.decide(approval_id(1), edit(rewritten), at(31), &policy()), Ok(DecideOutcome::Unchanged));
    for other in [edit(serde_json::json!({"env": "dev"})), ask(Decision::Approve, None)] {
        assert_eq!(
            run.decide(approval_id(1), other, at(32), &policy()),
            Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Approved))
        );
    }
}

#[test]
fn an_action_has_no_arguments_to_edit_or_bind_to() {
    let mut run = awaiting(1);
    assert_eq!(run.approvals[0].kind(), ApprovalKind::Action);
    assert_eq!(run.approvals[0].arguments_sha256(), None);
    assert_eq!(
        run.decide(approval_id(1), edit(serde_json::json!({})), at(30), &policy()),
        Err(TransitionError::NothingToEdit)
    );
    let bound = DecisionRequest { seen_sha256: Some("0".repeat(64)), ..ask(Decision::Approve, None) };
    assert_eq!(run.decide(approval_id(1), bound, at(30), &policy()), Err(TransitionError::ArgumentsChanged));
    assert_eq!(run.approvals[0].status, ApprovalStatus::Pending);
}

#[test]
fn extending_moves_expiry_later_only_and_warns_again() {
    let mut run = awaiting(1);
    let expires_at = run.approvals[0].expires_at.unwrap();
    let warn_at = run.due_at.unwrap();
    assert_eq!(run.sweep(warn_at, &policy()), SweepAction::Warned);
    assert!(run.approvals[0].expiry_warned);
    run.take_events();

    let day = Duration::from_secs(24 * 60 * 60);
    assert_eq!(run.extend_approval(approval_id(1), Duration::from_secs(60), warn_at, &policy()), Ok(Changed::No));
    assert_eq!(run.approvals[0].expires_at, Some(expires_at), "never earlier than it was");

    let now = warn_at.plus(Duration::from_secs(1));
    assert_eq!(run.extend_approval(approval_id(1), day, now, &policy()), Ok(Changed::Yes));
    assert_eq!(run.approvals[0].expires_at, Some(now.plus(day)));
    assert!(!run.approvals[0].expiry_warned);
    let warning = policy().approval_warning.as_millis() as i64;
    assert_eq!(run.due_at, Some(Timestamp::from_millis(now.plus(day).millis() - warning)));
    assert_eq!(kinds(&run), ["approval.extended"]);
    assert_eq!(run.extend_approval(approval_id(2), day, now, &policy()), Err(TransitionError::NoSuchApproval));
    run.decide(approval_id(1), ask(Decision::Approve, None), now, &policy()).unwrap();
    assert_eq!(
        run.extend_approval(approval_id(1), day, now, &policy()),
        Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Approved))
    );
}

#[test]
fn an_approval_past_its_time_expires_at_the_boundary_and_is_never_decided() {
    let mut run = awaiting(1);
    let expires_at = run.approvals[0].expires_at.unwrap();
    let just_before = Timestamp::from_millis(expires_at.millis() - 1);
    assert!(!run.clone().expire_if_due(approval_id(1), just_before, &policy()));
    assert!(run.expire_if_due(approval_id(1), expires_at, &policy()));
    assert_eq!((run.status, run.approvals[0].status), (RunStatus::Failed, ApprovalStatus::Expired));
    assert_eq!(
        run.decide(approval_id(1), ask(Decision::Approve, None), expires_at, &policy()),
        Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Expired))
    );
}

#[test]
fn edits_may_not_take_a_run_past_its_arguments_total() {
    let mut run = awaiting_tool_call();
    let big = serde_json::json!({"env": "x".repeat(MAX_APPROVAL_ARGUMENTS_PER_RUN)});
    assert_eq!(run.decide(approval_id(1), edit(big), at(30), &policy()), Err(TransitionError::TooManyArguments));
    assert_eq!(run.approvals[0].status, ApprovalStatus::Pending);
    assert!(run.pending_events.iter().all(|event| event.data.kind() != "approval.decided"));
}

#[test]
fn a_decision_that_leaves_others_pending_moves_the_sweepers_next_look() {
    let mut run = awaiting(2);
    let day = Duration::from_secs(24 * 60 * 60);
    run.extend_approval(approval_id(2), day * 7, at(25), &policy()).unwrap();
    assert_eq!(
        run.decide(approval_id(1), ask(Decision::Approve, None), at(30), &policy()),
        Ok(DecideOutcome::Recorded)
    );
    let warning = policy().approval_warning.as_millis() as i64;
    assert_eq!(run.due_at, Some(Timestamp::from_millis(at(25).plus(day * 7).millis() - warning)));
}

fn by_rule(n: u128, decided: Option<RuleDecision>, effect: Effect) -> (ApprovalId, ApprovalRequest) {
    let policy = PolicyMatch { rule: format!("rule-{n}"), effect, mode: RuleMode::Enforce, version: 2 };
    let call = ProposedCall { tool: "delete_branch".into(), arguments: serde_json::json!({"n": n}) };
    (approval_id(n), ApprovalRequest { policy: Some(policy), decided, ..ApprovalRequest::call("Delete", call) })
}

/// A rule's decision is an approval already resolved, by the rule, with
/// both events; the run waits only for what a person decides.
#[test]
fn calls_a_rule_decided_are_recorded_resolved_and_only_the_rest_wait() {
    let mut run = running();
    let requests = vec![
        by_rule(1, Some(RuleDecision::Allowed), Effect::Allow),
        by_rule(2, Some(RuleDecision::Denied { reason: Some("too many".into()) }), Effect::Deny),
        by_rule(3, None, Effect::Ask),
    ];
    run.pending_events.clear();
    run.park("w1", requests, serde_json::json!({}), at(20), &policy()).unwrap();
    let statuses: Vec<_> = run.approvals.iter().map(|approval| approval.status).collect();
    assert_eq!(statuses, [ApprovalStatus::Approved, ApprovalStatus::Rejected, ApprovalStatus::Pending]);
    let denied = &run.approvals[1];
    assert_eq!(denied.resolved_by, Some(Resolver::Policy("rule-2".into())));
    assert_eq!((denied.resolved_at, denied.comment.as_deref()), (Some(at(20)), Some("too many")));
    assert_eq!(run.approvals[2].policy.as_ref().map(|policy| policy.effect), Some(Effect::Ask));
    assert_eq!(
        kinds(&run),
        [
            "approval.requested",
            "approval.decided",
            "approval.requested",
            "approval.decided",
            "approval.requested",
            "run.awaiting_approval"
        ]
    );
    assert!(
        matches!(&run.pending_events[5].data, EventData::RunAwaitingApproval { approval_ids } if approval_ids == &[approval_id(3)])
    );
    // The person's decision is all that resumes it.
    assert_eq!(
        run.decide(approval_id(3), ask(Decision::Approve, None), at(30), &policy()),
        Ok(DecideOutcome::Requeued)
    );
}

#[test]
fn when_rules_decided_every_call_the_run_goes_on_and_never_parks() {
    let mut run = running();
    let all_decided = vec![by_rule(1, Some(RuleDecision::Allowed), Effect::Allow)];
    assert_eq!(
        run.clone().park("w1", all_decided.clone(), serde_json::json!({}), at(20), &policy()),
        Err(TransitionError::InvalidState(RunStatus::Running)),
        "no one could resume it"
    );
    run.record_rule_decisions("w1", all_decided, serde_json::json!({"step": 2}), at(20), &policy()).unwrap();
    assert_eq!((run.status, run.approvals[0].status), (RunStatus::Running, ApprovalStatus::Approved));
    assert_eq!(run.checkpoint, Some(serde_json::json!({"step": 2})));
    let asked = vec![by_rule(2, None, Effect::Ask)];
    assert!(run.record_rule_decisions("w1", asked, serde_json::json!({}), at(21), &policy()).is_err());
    assert!(
        run.record_rule_decisions("w2", vec![], serde_json::json!({}), at(21), &policy()).is_err(),
        "not its lease"
    );
}

/// A tool call with a veto window of 15 minutes, asked at `at(20)`.
fn awaiting_with_veto_window() -> Run {
    let mut run = running();
    let request = ApprovalRequest {
        auto_approve_after: Some(Duration::from_secs(900)),
        ..ApprovalRequest::call(
            "Call the tool `rotate`",
            ProposedCall { tool: "rotate".into(), arguments: serde_json::json!({"key": "k1"}) },
        )
    };
    run.park("w1", vec![(approval_id(1), request)], serde_json::json!({}), at(20), &policy()).unwrap();
    run
}

/// An `ask` rule means a person decides: its approval has no veto window,
/// however the tool is defined; a `log_only` ask, which decides nothing,
/// leaves the tool's window.
#[test]
fn an_ask_rule_takes_the_veto_window_away() {
    let window = Some(Duration::from_secs(900));
    let (_, asked) = by_rule(1, None, Effect::Ask);
    let asked = ApprovalRequest { auto_approve_after: window, ..asked };
    let mut logged = asked.clone();
    logged.policy.as_mut().unwrap().mode = RuleMode::LogOnly;
    let mut run = running();
    run.park("w1", vec![(approval_id(1), asked), (approval_id(2), logged)], serde_json::json!({}), at(20), &policy())
        .unwrap();
    assert_eq!(run.approvals[0].auto_approves_at, None, "a person must decide");
    assert_eq!(run.approvals[1].auto_approves_at, Some(at(20).plus(Duration::from_secs(900))));
    let ends = at(20).plus(Duration::from_secs(900));
    assert_eq!(run.auto_approve_if_due(approval_id(1), ends, &policy()), None);
}

#[test]
fn a_veto_window_approves_as_timeout_when_it_ends_and_the_run_resumes() {
    let mut run = awaiting_with_veto_window();
    let ends = at(20).plus(Duration::from_secs(900));
    assert_eq!(run.approvals[0].auto_approves_at, Some(ends));
    assert!(run.approvals[0].expires_at.unwrap() >= ends, "it never expires before its window ends");
    assert!(run.due_at.is_some_and(|due| due <= ends), "the sweeper comes by then");
    let just_before = Timestamp::from_millis(ends.millis() - 1);
    assert_eq!(run.sweep(just_before, &policy()), SweepAction::Nothing);
    run.due_at = Some(ends);
    assert_eq!(run.sweep(ends, &policy()), SweepAction::Enqueue);
    let approval = &run.approvals[0];
    assert_eq!((approval.status, approval.resolved_by.as_ref()), (ApprovalStatus::Approved, Some(&Resolver::Timeout)));
    assert_eq!(approval.resolved_at, Some(ends));
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(kinds(&run)[kinds(&run).len() - 2..], ["approval.decided", "run.resumed"]);
    assert_eq!(Resolver::Timeout.to_string().parse::<Resolver>(), Ok(Resolver::Timeout));
}

#[test]
fn a_person_decides_before_the_window_ends_and_a_late_decision_meets_the_timeout() {
    let ends = at(20).plus(Duration::from_secs(900));
    let mut run = awaiting_with_veto_window();
    assert_eq!(run.auto_approve_if_due(approval_id(1), at(30), &policy()), None);
    run.decide(approval_id(1), ask(Decision::Reject, Some("not now".into())), at(30), &policy()).unwrap();
    assert_eq!(run.approvals[0].status, ApprovalStatus::Rejected);
    assert_eq!(run.auto_approve_due(ends, &policy()), None, "decided: nothing left to approve");

    // Past the window, the timeout comes first: an approve repeats it, a reject is refused.
    let mut run = awaiting_with_veto_window();
    assert_eq!(run.auto_approve_if_due(approval_id(1), ends, &policy()), Some(DecideOutcome::Requeued));
    assert_eq!(run.decide(approval_id(1), ask(Decision::Approve, None), ends, &policy()), Ok(DecideOutcome::Unchanged));
    assert_eq!(
        run.decide(approval_id(1), ask(Decision::Reject, None), ends, &policy()),
        Err(TransitionError::ApprovalAlreadyResolved(ApprovalStatus::Approved))
    );
}

#[test]
fn extend_moves_the_window_never_earlier_and_a_cancel_before_it_wins() {
    let ends = at(20).plus(Duration::from_secs(900));
    let mut run = awaiting_with_veto_window();
    let now = at(30);
    assert_eq!(run.extend_approval(approval_id(1), Duration::from_secs(3_600), now, &policy()), Ok(Changed::Yes));
    assert_eq!(run.approvals[0].auto_approves_at, Some(now.plus(Duration::from_secs(3_600))));
    assert!(run.approvals[0].expires_at.unwrap() >= now.plus(Duration::from_secs(3_600)));
    // A shorter extension moves nothing.
    assert_eq!(run.extend_approval(approval_id(1), Duration::from_secs(60), now, &policy()), Ok(Changed::No));
    assert_eq!(run.auto_approve_due(ends, &policy()), None, "the window now ends later");

    let mut run = awaiting_with_veto_window();
    run.cancel(at(30)).unwrap();
    assert_eq!(run.approvals[0].status, ApprovalStatus::Canceled);
    assert_eq!(run.auto_approve_due(ends, &policy()), None);
    assert_eq!(run.status, RunStatus::Canceled);
}

/// One approval without a window expires at the very time another's
/// window ends: the expiry wins (the run fails), as a late decision never
/// counts; and an approval with a window is never warned about or expired.
#[test]
fn an_expiry_at_the_end_of_another_window_fails_the_run_and_a_windowed_approval_never_expires() {
    let mut run = running();
    let window = policy().approval_timeout;
    let windowed = ApprovalRequest {
        auto_approve_after: Some(window),
        ..ApprovalRequest::call("a", ProposedCall { tool: "a".into(), arguments: serde_json::json!({}) })
    };
    let plain = ApprovalRequest::call("b", ProposedCall { tool: "b".into(), arguments: serde_json::json!({}) });
    run.park("w1", vec![(approval_id(1), windowed), (approval_id(2), plain)], serde_json::json!({}), at(20), &policy())
        .unwrap();
    let ends = at(20).plus(window);
    assert_eq!(run.approvals[0].expires_at, Some(ends));
    assert!(!run.approval_past_expiry(approval_id(1), ends), "it is approved, not expired");
    assert!(run.clone().expire_if_due(approval_id(2), ends, &policy()));
    run.due_at = Some(ends);
    assert_eq!(run.sweep(ends, &policy()), SweepAction::Failed);
    assert_eq!(run.approvals[0].status, ApprovalStatus::Canceled);
    assert_eq!(run.approvals[1].status, ApprovalStatus::Expired);

    // Alone, the windowed one is approved at its expiry, never warned about.
    let mut run = awaiting_with_veto_window();
    let warn_at = Timestamp::from_millis(run.approvals[0].expires_at.unwrap().millis() - 1);
    run.due_at = Some(warn_at);
    assert_eq!(run.sweep(warn_at, &policy()), SweepAction::Enqueue, "its window ended long before");
    assert!(!kinds(&run).contains(&"approval.expiring"));
}

#[test]
fn with_two_approvals_the_window_approves_its_own_and_the_run_waits_for_the_other() {
    let mut run = running();
    let windowed = ApprovalRequest {
        auto_approve_after: Some(Duration::from_secs(60)),
        ..ApprovalRequest::call("a", ProposedCall { tool: "a".into(), arguments: serde_json::json!({}) })
    };
    let plain = ApprovalRequest::call("b", ProposedCall { tool: "b".into(), arguments: serde_json::json!({}) });
    run.park("w1", vec![(approval_id(1), windowed), (approval_id(2), plain)], serde_json::json!({}), at(20), &policy())
        .unwrap();
    let ends = at(20).plus(Duration::from_secs(60));
    run.due_at = Some(ends);
    assert_eq!(run.sweep(ends, &policy()), SweepAction::AutoApproved);
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    assert_eq!(run.approvals[1].status, ApprovalStatus::Pending);
    assert!(run.due_at.is_some_and(|due| due > ends), "next: the other's warning or expiry");
}
