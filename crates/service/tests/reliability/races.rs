//! Races between real concurrent tasks, and a share of calls failing.

use super::*;

/// One run, driven to `awaiting_approval` on a fresh world.
pub(super) async fn awaiting_run(world: &World) -> (RunId, String) {
    let api = world.api(Arc::new(Healthy));
    let (_, run) = world
        .call(&api, "POST", "/v1/agent/runs", json!({"agent": "script", "input": "approve Go\nsay done"}), None)
        .await;
    let id: RunId = run["id"].as_str().unwrap().parse().unwrap();
    let (_stop, stop) = watch::channel(false);
    for (message_id, message) in world.queue.receive() {
        world.worker(Arc::new(Healthy)).process(&message, &stop).await.unwrap();
        world.queue.ack(message_id);
    }
    let approval = world.run(id).await.approvals[0].id.to_string();
    (id, approval)
}

pub(super) const RACES: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
pub(super) async fn races_have_exactly_one_winner_and_the_loser_gets_409_or_drops_the_message() {
    let mut outcomes: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for _ in 0..RACES {
        let world = Arc::new(World::new().await);

        // Cancel against approve, from two clients at once.
        let (id, approval) = awaiting_run(&world).await;
        let (one, two) = (world.api(Arc::new(Healthy)), world.api(Arc::new(Healthy)));
        let (cancel_path, decide_path) =
            (format!("/v1/agent/runs/{id}/cancel"), format!("/v1/agent/runs/{id}/approvals/{approval}"));
        let (cancel, approve) = tokio::join!(
            world.call(&one, "POST", &cancel_path, json!({}), None),
            world.call(&two, "POST", &decide_path, json!({"decision": "approve"}), None),
        );
        // Either order ends canceled. Cancel first: the pending approval is
        // canceled and the decision refused. Approve first: the decision
        // stands and the cancel stops the requeued run.
        let run = world.run(id).await;
        assert_eq!(run.status, RunStatus::Canceled);
        assert_eq!(cancel.0, 200);
        let approval_status = run.approvals[0].status.as_str();
        match approve.0 {
            409 => assert_eq!(approval_status, "canceled"),
            200 => assert_eq!(approval_status, "approved"),
            other => panic!("unexpected {other}"),
        }
        *outcomes.entry("cancel vs approve").or_default().entry(format!("approval {approval_status}")).or_default() +=
            1;

        // Two deciders with different decisions.
        let (id, approval) = awaiting_run(&world).await;
        let path = format!("/v1/agent/runs/{id}/approvals/{approval}");
        let (a, b) = tokio::join!(
            world.call(&one, "POST", &path, json!({"decision": "approve"}), None),
            world.call(&two, "POST", &path, json!({"decision": "reject"}), None),
        );
        let mut statuses = [a.0, b.0];
        statuses.sort();
        assert_eq!(statuses, [200, 409], "exactly one decision wins");
        let decided = world.run(id).await.approvals[0].status;
        let winner = if a.0 == 200 { "approved" } else { "rejected" };
        assert_eq!(decided.as_str(), winner);
        *outcomes.entry("approve vs reject").or_default().entry(winner.into()).or_default() += 1;

        // Two workers claiming one run from duplicate messages, and a cancel racing the finish.
        let api = world.api(Arc::new(Healthy));
        let (_, run) =
            world.call(&api, "POST", "/v1/agent/runs", json!({"agent": "script", "input": "say a\nsay b"}), None).await;
        let id: RunId = run["id"].as_str().unwrap().parse().unwrap();
        let message = RunMessage { run_id: id, owner: Owner::parse("sim").unwrap() };
        let (_stop, stop) = watch::channel(false);
        let (worker_one, worker_two) = (world.worker(Arc::new(Healthy)), world.worker(Arc::new(Healthy)));
        let cancel_path = format!("/v1/agent/runs/{id}/cancel");
        let (first, second, cancel) = tokio::join!(
            async { worker_one.process(&message, &stop).await.unwrap() },
            async { worker_two.process(&message, &stop).await.unwrap() },
            world.call(&one, "POST", &cancel_path, json!({}), None),
        );
        let run = world.run(id).await;
        let finished = [first, second].iter().filter(|o| **o == Outcome::Succeeded).count();
        match run.status {
            RunStatus::Succeeded => {
                assert_eq!((finished, cancel.0), (1, 409), "{first:?} {second:?} {cancel:?}");
                assert_eq!(run.output.as_deref(), Some("a\nb"));
            }
            RunStatus::Canceled => {
                assert_eq!((finished, cancel.0), (0, 200), "{first:?} {second:?} {cancel:?}");
                assert!(run.output.is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            [first, second].iter().all(|o| matches!(o, Outcome::Succeeded | Outcome::Dropped | Outcome::LostLease))
        );
        assert!(world.store.hooks().0.lock().unwrap().values().all(|writes| *writes == 1));
        *outcomes.entry("two workers and a cancel").or_default().entry(format!("{:?}", run.status)).or_default() += 1;
    }
    let report = format!("races, {RACES} of each: {outcomes:#?}\n");
    print!("{report}");
    std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/reliability-races.txt"), report).unwrap();
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn with_a_share_of_calls_failing_clients_see_only_503_and_nothing_is_lost() {
    let world = World::new().await;
    let faults = RandomFailures::new(0.3, 7);
    let api = world.api(faults.clone());
    let (_stop, stop) = watch::channel(false);
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut accepted = Vec::new();
    for i in 0..200 {
        let key = format!("k{i}");
        let (status, reply) =
            world.call(&api, "POST", "/v1/agent/runs", json!({"input": format!("{i}")}), Some(&key)).await;
        *statuses.entry(status).or_default() += 1;
        faults.set_share(0.0);
        world.assert_active_count_is_true(&format!("create {i}")).await;
        faults.set_share(0.3);
        match status {
            201 => accepted.push(reply["id"].as_str().unwrap().parse::<RunId>().unwrap()),
            503 => assert_eq!(reply["error"]["code"], "unavailable"),
            other => panic!("only 201 or 503 while the store fails: {other} {reply}"),
        }
        // Workers and the sweeper suffer the same faults.
        for (message_id, message) in world.queue.receive() {
            if world.worker(faults.clone()).process(&message, &stop).await.is_ok() {
                world.queue.ack(message_id);
            }
        }
        let _ = world.sweeper(faults.clone()).sweep().await;
        world.clock.advance(Duration::from_secs(1));
    }
    assert!(statuses.get(&503).copied().unwrap_or(0) > 10 && !accepted.is_empty(), "{statuses:?}");

    // The fault clears: every accepted run finishes.
    faults.set_share(0.0);
    for _ in 0..60 {
        for (message_id, message) in world.queue.receive() {
            if world.worker(faults.clone()).process(&message, &stop).await.is_ok() {
                world.queue.ack(message_id);
            }
        }
        world.sweeper(faults.clone()).sweep().await.unwrap();
        world.clock.advance(STEP);
    }
    let mut succeeded = 0;
    for id in &accepted {
        let run = world.run(*id).await;
        match run.status {
            RunStatus::Succeeded => succeeded += 1,
            // A worker that keeps failing mid-run uses up the run's attempts.
            RunStatus::Failed => assert!(run.error.as_deref().unwrap().contains("attempts"), "{:?}", run.error),
            other => panic!("not finished: {other:?}"),
        }
    }
    assert!(succeeded * 10 >= accepted.len() * 9, "most runs survive the outage: {succeeded} of {}", accepted.len());
    let report = format!(
        "outage at 30%: {} requests {statuses:?}, {} faults injected, {} accepted runs, {succeeded} succeeded\n",
        statuses.values().sum::<usize>(),
        faults.injected.load(Ordering::SeqCst),
        accepted.len()
    );
    print!("{report}");
    std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/reliability-outage.txt"), report).unwrap();
}
