//! An approved call whose result cannot be saved at once is still made exactly once.

use super::*;

/// Fails the first store write made after the tool server received a call:
/// the save of the tool's result.
pub(super) struct FailTheSaveAfterTheToolCall {
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
pub(super) async fn an_approved_call_whose_result_cannot_be_saved_once_is_still_made_exactly_once() {
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
pub(super) async fn a_park_that_cannot_be_written_hands_the_run_back_as_it_was_before_the_step() {
    let fixture = Fixture::new().await;
    let delete = || tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#);
    fixture.stand_in.script(vec![delete(), delete(), text("Deleted old.")]);
    let message = fixture.create("Delete the branch old").await;

    // Updates: the claim, then the park, which carries the model's answer
    // with the approval it asks for (nothing ran before it).
    let plan = OnCalls::nth("update", 2, Fault::FailBefore);
    let worker = fixture.faulty_worker(plan, &fixture.policy);
    assert!(worker.process(&message, &running()).await.is_err());
    let run = fixture.run(&message).await;
    assert_eq!(run.status, RunStatus::Queued, "handed back");
    assert!(run.approvals.is_empty());
    assert!(run.checkpoint.is_none(), "as before the step: the answer went with the park");

    // The retry asks the model again, then for the approval, rather than
    // fail for want of it.
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    assert_eq!(fixture.run(&message).await.approvals.len(), 1);
    fixture.decide(&message, Decision::Approve, None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(fixture.stand_in.tool_calls().len(), 1, "the tool is called exactly once");
    assert_eq!(
        fixture.stand_in.model_requests().len(),
        3,
        "the lost answer was asked for again; the park's resume asks once"
    );
}

#[tokio::test]
pub(super) async fn a_step_whose_lease_lapsed_here_is_given_up_unless_it_reached_a_tool() {
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
pub(super) async fn a_stop_lets_a_tool_call_in_flight_end_and_records_its_result() {
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
pub(super) async fn a_model_that_never_answers_cannot_keep_the_run_past_its_time_limit() {
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
pub(super) async fn a_final_answer_whose_write_failed_is_logged_once() {
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
