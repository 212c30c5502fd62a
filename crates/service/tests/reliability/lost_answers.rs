//! Sends and writes whose answers were lost: creates, replays, takeovers, decisions and batches.

use super::*;

/// A queue whose send first does `during` (the client's retry, or a worker
/// that got the message) and then reports a failure: a slow send that
/// times out, or with `deliver` an ambiguous one that did deliver.
pub(super) struct SendThenFail {
    inner: Arc<SimQueue>,
    deliver: bool,
    during: Mutex<Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>>,
}

#[async_trait]
impl RunQueue for SendThenFail {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError> {
        if self.deliver {
            self.inner.enqueue(message).await?;
        }
        let during = self.during.lock().unwrap().take();
        if let Some(during) = during {
            during.await;
        }
        Err(QueueError::Unavailable(Box::new(agent_runs_testkit::faults::InjectedFault("enqueue"))))
    }
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_replay_answered_while_the_first_send_hangs_keeps_its_run_when_that_send_fails() {
    let world = Arc::new(World::new().await);
    let body = json!({"input": "hello"});
    let replayed = Arc::new(Mutex::new(None));
    let retry = {
        let (world, replayed, body) = (world.clone(), replayed.clone(), body.clone());
        Box::pin(async move {
            let api = world.api(Arc::new(Healthy));
            *replayed.lock().unwrap() = Some(world.call(&api, "POST", "/v1/agent/runs", body, Some("k")).await);
        })
    };
    let queue = Arc::new(SendThenFail { inner: world.queue.clone(), deliver: false, during: Mutex::new(Some(retry)) });
    let api = world.api_with_queue(Arc::new(Healthy), queue);
    let (status, first) = world.call(&api, "POST", "/v1/agent/runs", body, Some("k")).await;
    let (replay_status, replay) = replayed.lock().unwrap().take().unwrap();

    assert_eq!(replay_status, 201, "{replay}");
    assert_eq!(status, 201, "the run a replay answered with is not undone: {first}");
    assert_eq!(first["id"], replay["id"]);
    let runs = world.all_runs().await;
    assert_eq!(runs.len(), 1);
    world.assert_active_count_is_true("after the replay").await;
    // The replay sent the run itself: it runs.
    let (_stop, stop) = watch::channel(false);
    for (message_id, message) in world.queue.receive() {
        world.worker(Arc::new(Healthy)).process(&message, &stop).await.unwrap();
        world.queue.ack(message_id);
    }
    assert_eq!(world.run(runs[0].id).await.status, RunStatus::Succeeded);
    world.assert_active_count_is_true("after the run").await;
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_send_that_delivers_but_reports_a_failure_never_deletes_the_run_it_started() {
    let world = Arc::new(World::new().await);
    let body = json!({"input": "hello"});
    let work = {
        let world = world.clone();
        Box::pin(async move {
            let (_stop, stop) = watch::channel(false);
            for (message_id, message) in world.queue.receive() {
                assert_eq!(world.worker(Arc::new(Healthy)).process(&message, &stop).await.unwrap(), Outcome::Succeeded);
                world.queue.ack(message_id);
            }
        })
    };
    let queue = Arc::new(SendThenFail { inner: world.queue.clone(), deliver: true, during: Mutex::new(Some(work)) });
    let api = world.api_with_queue(Arc::new(Healthy), queue);
    let (status, first) = world.call(&api, "POST", "/v1/agent/runs", body.clone(), Some("k")).await;
    assert_eq!(status, 201, "the run was delivered and ran: {first}");
    let id: RunId = first["id"].as_str().unwrap().parse().unwrap();
    let run = world.run(id).await;
    assert_eq!((run.status, run.output.as_deref()), (RunStatus::Succeeded, Some("hello")));
    world.assert_active_count_is_true("after the ambiguous send").await;

    // The client's retry gets the same run, and no second one is made.
    let (status, again) = world.call(&world.api(Arc::new(Healthy)), "POST", "/v1/agent/runs", body, Some("k")).await;
    assert_eq!((status, &again["id"]), (201, &first["id"]));
    assert_eq!(world.all_runs().await.len(), 1);
    assert!(world.store.hooks().0.lock().unwrap().values().all(|writes| *writes == 1));
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_create_whose_send_fails_is_undone_and_its_key_is_free_again() {
    let world = World::new().await;
    let body = json!({"input": "hello"});
    let queue = Arc::new(SendThenFail { inner: world.queue.clone(), deliver: false, during: Mutex::new(None) });
    let (status, reply) = world
        .call(&world.api_with_queue(Arc::new(Healthy), queue), "POST", "/v1/agent/runs", body.clone(), Some("k"))
        .await;
    assert_eq!((status, reply["error"]["code"].as_str()), (503, Some("unavailable")));
    assert!(world.all_runs().await.is_empty());
    world.assert_active_count_is_true("after the undo").await;
    let (status, _) = world.call(&world.api(Arc::new(Healthy)), "POST", "/v1/agent/runs", body, Some("k")).await;
    assert_eq!(status, 201);
    assert_eq!(world.all_runs().await.len(), 1);
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_create_whose_undo_fails_answers_by_what_the_store_holds() {
    use agent_runs_testkit::faults::Fault;
    for (fault, expected) in [(Fault::FailBefore, 201), (Fault::FailAfter, 503)] {
        let world = World::new().await;
        let queue = Arc::new(SendThenFail { inner: world.queue.clone(), deliver: false, during: Mutex::new(None) });
        let api = world.api_with_queue(agent_runs_testkit::faults::OnCalls::from("undo_create", 1, fault), queue);
        let (status, reply) = world.call(&api, "POST", "/v1/agent/runs", json!({"input": "hi"}), Some("k")).await;
        assert_eq!(status, expected, "{fault:?}: {reply}");
        let runs = world.all_runs().await;
        assert_eq!(runs.len(), usize::from(expected == 201), "{fault:?}: a 201 has its run, a 503 has none");
        if expected == 201 {
            assert_eq!(reply["id"], runs[0].id.to_string());
        }
        world.assert_active_count_is_true("after the failed undo").await;
    }
}

/// A create whose write may have landed (its answer lost) is a 503, and its
/// run is sent all the same: a landed run starts at once rather than at the
/// sweeper's requeue a minute later; a message for a run never written is
/// dropped by the worker.
#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_create_whose_write_may_have_landed_sends_its_run_all_the_same() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    for (fault, landed) in [(Fault::FailAfter, true), (Fault::FailBefore, false)] {
        let world = World::new().await;
        let api = world.api(OnCalls::nth("insert", 1, fault));
        let (status, reply) = world.call(&api, "POST", "/v1/agent/runs", json!({"input": "hi"}), None).await;
        assert_eq!(status, 503, "{fault:?}: {reply}");
        assert_eq!(world.all_runs().await.len(), usize::from(landed), "{fault:?}");
        let messages = world.queue.receive();
        assert_eq!(messages.len(), 1, "{fault:?}: sent without waiting for the sweeper");
        let (_, stop) = watch::channel(false);
        let outcome = world.worker(Arc::new(Healthy)).process(&messages[0].1, &stop).await.unwrap();
        assert_eq!(outcome, if landed { Outcome::Succeeded } else { Outcome::Dropped }, "{fault:?}");
        world.assert_active_count_is_true("after the lost answer").await;
    }
}

/// A create of unknown outcome whose send hangs still answers its 503: the
/// send is given a short wait, not the whole request's time.
#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_create_of_unknown_outcome_whose_send_hangs_still_answers() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    let hangs = std::future::pending::<()>();
    let queue = Arc::new(SendThenFail {
        inner: world.queue.clone(),
        deliver: false,
        during: Mutex::new(Some(Box::pin(hangs))),
    });
    let api = world.api_with_queue(OnCalls::nth("insert", 1, Fault::FailAfter), queue);
    let call = world.call(&api, "POST", "/v1/agent/runs", json!({"input": "hi"}), None);
    let (status, reply) = tokio::time::timeout(Duration::from_secs(10), call).await.expect("answered, not hung");
    assert_eq!((status, reply["error"]["code"].as_str()), (503, Some("unavailable")));
    assert_eq!(world.all_runs().await.len(), 1, "the run landed; the sweeper sends it");
}

/// Lets the first `ok` writes through, then fails every write until healed.
pub(super) struct WritesFailAfter {
    ok: std::sync::atomic::AtomicIsize,
}

impl FaultPlan for WritesFailAfter {
    fn next(&self, operation: &'static str) -> agent_runs_testkit::faults::Fault {
        if operation != "update" || self.ok.fetch_sub(1, Ordering::SeqCst) > 0 {
            agent_runs_testkit::faults::Fault::None
        } else {
            agent_runs_testkit::faults::Fault::FailBefore
        }
    }
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn one_long_lived_worker_takes_over_a_run_its_own_dead_attempt_left_running() {
    let world = World::new().await;
    let api = world.api(Arc::new(Healthy));
    let (_, created) =
        world.call(&api, "POST", "/v1/agent/runs", json!({"agent": "script", "input": "say a\nsay b"}), None).await;
    let id: RunId = created["id"].as_str().unwrap().parse().unwrap();
    let message = RunMessage { run_id: id, owner: Owner::parse("sim").unwrap() };
    // One worker for the whole test, as a warm Lambda container keeps one.
    let plan = Arc::new(WritesFailAfter { ok: 1.into() });
    let worker = world.worker(plan.clone());
    let (_stop, stop) = watch::channel(false);

    // The claim is written; the finish and the hand-back are not.
    assert!(worker.process(&message, &stop).await.is_err());
    assert_eq!(world.run(id).await.status, RunStatus::Running);
    plan.ok.store(isize::MAX, Ordering::SeqCst);
    // While the dead attempt's lease lasts, a redelivery is dropped...
    assert_eq!(worker.process(&message, &stop).await.unwrap(), Outcome::Dropped);
    // ...and once it expired, the same worker takes the run over.
    world.clock.advance(world.policy.lease);
    assert_eq!(worker.process(&message, &stop).await.unwrap(), Outcome::Succeeded);
    let run = world.run(id).await;
    assert_eq!((run.attempts, run.output.as_deref()), (2, Some("a\nb")));
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn the_default_route_serves_no_operation_only_404_and_405() {
    let world = World::new().await;
    let api = world.api(Arc::new(Healthy));
    let request = |method: &str, body: &str| {
        http::Request::builder()
            .method(method)
            .uri("/v1/agent/runs")
            .header("authorization", format!("Bearer {}", world.key))
            .header("content-type", "application/json")
            .body(Bytes::from(body.to_owned()))
            .unwrap()
    };
    let created = api.handle_as(None, request("POST", r#"{"input": "x"}"#)).await;
    assert_eq!(created.status(), 404, "the fallback never creates a run");
    assert!(world.all_runs().await.is_empty());
    assert_eq!(api.handle_as(None, request("GET", "")).await.status(), 404);
    let other_method = api.handle_as(None, request("DELETE", "")).await;
    assert_eq!(other_method.status(), 405);
    assert_eq!(other_method.headers()["allow"], "GET, POST");
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_last_decision_whose_answer_was_lost_still_sends_the_run() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    let (id, approval) = awaiting_run(&world).await;
    assert!(world.queue.receive().is_empty());
    // The decision lands, its answer is lost, and the retry reads it back
    // as already made: the run, queued again, must still be sent.
    let api = world.api(OnCalls::nth("update", 1, Fault::ConflictAfter));
    let path = format!("/v1/agent/runs/{id}/approvals/{approval}");
    let (status, run) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("queued")), "{run}");
    let sent = world.queue.receive();
    assert_eq!(sent.len(), 1, "the run is sent now, not a minute later by the sweeper");
    // Repeated at once, it is not sent again: one process (this Api) sends a
    // run for repeats at most every 10 s, so repeats cannot flood the queue.
    for _ in 0..3 {
        let (status, _) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
        assert_eq!(status, 200);
    }
    assert!(world.queue.receive().is_empty(), "repeats moments later send nothing more");
    // Later, a repeat while the run still waits sends it again; the worker
    // runs it once and drops the duplicate.
    world.clock.advance(Duration::from_secs(11));
    let (status, _) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
    assert_eq!(status, 200);
    let again = world.queue.receive();
    assert_eq!(again.len(), 1, "a later repeat sends the queued run again");
    let (_stop, stop) = watch::channel(false);
    let worker = world.worker(Arc::new(Healthy));
    assert_eq!(worker.process(&sent[0].1, &stop).await.unwrap(), Outcome::Succeeded);
    assert_eq!(worker.process(&again[0].1, &stop).await.unwrap(), Outcome::Dropped);
    // Once the run has moved on, a repeat sends nothing.
    world.clock.advance(Duration::from_secs(11));
    let (status, _) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
    assert_eq!(status, 200);
    assert!(world.queue.receive().is_empty(), "no message for a run that has moved on");
    world.assert_active_count_is_true("after the run").await;
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_decision_answered_503_after_it_landed_is_sent_by_its_retry() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    let (id, approval) = awaiting_run(&world).await;
    let path = format!("/v1/agent/runs/{id}/approvals/{approval}");
    // The decision's write lands, but the store answers with an error: 503.
    let api = world.api(OnCalls::nth("update", 1, Fault::FailAfter));
    let (status, _) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
    assert_eq!(status, 503);
    assert_eq!(world.run(id).await.status, RunStatus::Queued, "the decision landed");
    assert!(world.queue.receive().is_empty(), "a failed request sends nothing");
    // The client's retry finds the decision made and the run waiting: sent now.
    let (status, run) =
        world.call(&world.api(Arc::new(Healthy)), "POST", &path, json!({"decision": "approve"}), None).await;
    assert_eq!((status, run["status"].as_str()), (200, Some("queued")), "{run}");
    let sent = world.queue.receive();
    assert_eq!(sent.len(), 1, "the retry sends the run, not the sweeper a minute later");
    let (_stop, stop) = watch::channel(false);
    assert_eq!(world.worker(Arc::new(Healthy)).process(&sent[0].1, &stop).await.unwrap(), Outcome::Succeeded);
}

/// A run decided, repeated, parked again and decided again within the
/// spacing, the last decision's answer lost: that decision's own send is
/// owed and made; the spacing only holds back repeats of another request.
#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_second_park_decided_with_a_lost_answer_is_sent_within_the_spacing() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    // One process: the first decision writes, the second's answer is lost.
    let api = world.api(OnCalls::nth("update", 2, Fault::ConflictAfter));
    let body = json!({"agent": "script", "input": "approve First\napprove Second\nsay done"});
    let (_, run) = world.call(&api, "POST", "/v1/agent/runs", body, None).await;
    let id: RunId = run["id"].as_str().unwrap().parse().unwrap();
    let (_stop, stop) = watch::channel(false);
    let worker = world.worker(Arc::new(Healthy));
    for (message_id, message) in world.queue.receive() {
        worker.process(&message, &stop).await.unwrap();
        world.queue.ack(message_id);
    }
    let first = world.run(id).await.approvals[0].id;
    let path = format!("/v1/agent/runs/{id}/approvals/{first}");
    for _ in 0..2 {
        let (status, _) = world.call(&api, "POST", &path, json!({"decision": "approve"}), None).await;
        assert_eq!(status, 200);
    }
    let sent = world.queue.receive();
    assert_eq!(sent.len(), 1, "the decision sent, its repeat held back by the spacing");
    worker.process(&sent[0].1, &stop).await.unwrap();
    world.queue.ack(sent[0].0);
    let parked = world.run(id).await;
    assert_eq!(parked.status, RunStatus::AwaitingApproval, "parked again for the second");
    let second = parked.approvals[1].id;
    let (status, _) = world
        .call(&api, "POST", &format!("/v1/agent/runs/{id}/approvals/{second}"), json!({"decision": "approve"}), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(world.queue.receive().len(), 1, "the lost answer's own send is made, within the spacing");
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_batch_whose_answer_was_lost_still_sends_its_runs_once() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    let (first, first_approval) = awaiting_run(&world).await;
    let (second, second_approval) = awaiting_run(&world).await;
    assert!(world.queue.receive().is_empty());
    let body = json!({"decisions": [
        {"run_id": first, "approval_id": first_approval, "decision": "approve"},
        {"run_id": second, "approval_id": second_approval, "decision": "approve"},
    ]});
    // The batch lands, its answer is lost, and the retry reads both runs back
    // as already decided: both must still be sent, once.
    let api = world.api(OnCalls::nth("update_batch", 1, Fault::ConflictAfter));
    let (status, reply) = world.call(&api, "POST", "/v1/approvals/batch", body.clone(), None).await;
    assert_eq!(status, 200, "{reply}");
    let statuses: Vec<&str> =
        reply["data"].as_array().unwrap().iter().map(|run| run["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["queued", "queued"]);
    let mut sent: Vec<RunId> = world.queue.receive().into_iter().map(|(_, message)| message.run_id).collect();
    sent.sort();
    let mut expected = vec![first, second];
    expected.sort();
    assert_eq!(sent, expected);
    // Repeated at once, the batch sends nothing more; later, while the runs
    // still wait for a worker (as after a 503 whose write landed), it sends
    // them again.
    let (status, _) = world.call(&api, "POST", "/v1/approvals/batch", body.clone(), None).await;
    assert_eq!(status, 200);
    assert!(world.queue.receive().is_empty(), "a batch repeated at once sends nothing more");
    world.clock.advance(Duration::from_secs(11));
    let (status, _) = world.call(&api, "POST", "/v1/approvals/batch", body.clone(), None).await;
    assert_eq!(status, 200);
    assert_eq!(world.queue.receive().len(), 2, "a later repeated batch sends its waiting runs again");
    for run_id in [first, second] {
        let run = world.run(run_id).await;
        let resumed =
            world.store.events(run_id, 0, 100).await.unwrap().events.iter().filter(|e| e.kind == "run.resumed").count();
        assert_eq!((run.version, resumed), (3, 1), "decided once");
    }
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn a_replay_whose_pin_answer_was_lost_still_sends_the_run() {
    use agent_runs_testkit::faults::{Fault, OnCalls};
    let world = World::new().await;
    let body = json!({"input": "hello"});
    // The first create's message is lost: the replay is what sends the run.
    let (status, first) =
        world.call(&world.api(Arc::new(Healthy)), "POST", "/v1/agent/runs", body.clone(), Some("k")).await;
    assert_eq!(status, 201);
    for (message_id, _) in world.queue.receive() {
        world.queue.ack(message_id);
    }
    let api = world.api(OnCalls::nth("update", 1, Fault::ConflictAfter));
    let (status, replay) = world.call(&api, "POST", "/v1/agent/runs", body, Some("k")).await;
    assert_eq!((status, &replay["id"]), (201, &first["id"]));
    assert_eq!(world.queue.receive().len(), 1, "the pinned run is sent though the pin's answer was lost");
}
