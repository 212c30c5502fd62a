//! Seeded schedules of crashes at every call of the API, the workers and the sweeper.

use super::*;

/// The kinds of run a schedule mixes, with the output each must end with.
pub(super) const KINDS: [(&str, &str, &str); 5] = [
    ("echo", "hello", "hello"),
    ("script", "say a\nsay b\nsay c", "a\nb\nc"),
    ("script", "say before\napprove Ship it\nsay after", "before\napproved: Ship it\nafter"),
    ("script", "say x\nfail it broke", ""),
    // Nobody decides: the sweeper approves it when its veto window ends.
    ("veto", "restart", "approved by timeout"),
];

/// Asks one approval with a veto window of a minute, then says who approved.
pub(super) struct VetoAgent;

#[async_trait]
impl agent_runs_agents::Agent for VetoAgent {
    fn validate_input(&self, _input: &str) -> Result<(), String> {
        Ok(())
    }

    async fn step(&self, step: agent_runs_agents::StepInput<'_>) -> agent_runs_agents::Step {
        use agent_runs_agents::Step;
        use agent_runs_domain::{ApprovalRequest, ApprovalStatus, Resolver};
        let Some(approval) = step.approvals.first() else {
            let request = ApprovalRequest {
                auto_approve_after: Some(Duration::from_secs(60)),
                ..ApprovalRequest::action("Restart")
            };
            return Step::AwaitApproval { requests: vec![request], checkpoint: json!({}) };
        };
        match (approval.status, &approval.resolved_by) {
            (ApprovalStatus::Approved, Some(Resolver::Timeout)) => Step::succeeded("approved by timeout"),
            (status, by) => Step::Failed(format!("decided otherwise: {status:?} by {by:?}")),
        }
    }
}

/// The one crash of a schedule: the first time its victim runs.
pub(super) struct Crash {
    victim: Victim,
    at: usize,
    after: bool,
    plan: Option<Arc<CrashAt>>,
}

impl Crash {
    fn plan(&mut self, this: Victim) -> Arc<dyn FaultPlan> {
        if this != self.victim || self.plan.is_some() {
            return Arc::new(Healthy);
        }
        let plan = CrashAt::new(self.at, self.after);
        self.plan = Some(plan.clone());
        plan
    }

    fn happened(&self) -> bool {
        self.plan.as_ref().is_some_and(|plan| plan.crashed())
    }
}

/// A run's log read through the API: gap-free from 1, one event per status
/// change in an order the state machine allows, the terminal event last and
/// showing the run as it ended, and no work reported twice.
pub(super) async fn assert_log_matches_the_run(world: &World, run: &Run, kind: usize, context: &str) {
    let path = format!("/v1/agent/runs/{}/events?limit=1000", run.id);
    let (status, page) = world.call(&world.api(Arc::new(Healthy)), "GET", &path, Value::Null, None).await;
    assert_eq!(status, 200, "{context}: {page}");
    let events = page["data"].as_array().unwrap();
    let seqs: Vec<u64> = events.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=run.event_seq).collect::<Vec<_>>(), "{context}: seqs from 1, no gaps, the run's count");
    assert_eq!(page["has_more"], false);
    let kinds: Vec<&str> = events.iter().map(|event| event["type"].as_str().unwrap()).collect();
    let mut status = None;
    let mut output = Vec::new();
    for (index, kind) in kinds.iter().enumerate() {
        let from = status;
        status = Some(match (*kind, from) {
            ("run.created", None) => "queued",
            ("run.started", Some("queued" | "running")) => "running",
            ("run.awaiting_approval", Some("running")) => "awaiting_approval",
            ("run.resumed", Some("awaiting_approval")) => "queued",
            ("run.requeued", Some("running")) => "queued",
            ("run.succeeded", Some("running")) => "succeeded",
            ("run.failed", Some("queued" | "running" | "awaiting_approval")) => "failed",
            ("run.canceled", Some("queued" | "running" | "awaiting_approval")) => "canceled",
            ("output.appended", Some("running")) => {
                output.push(events[index]["data"]["text"].as_str().unwrap());
                "running"
            }
            ("approval.requested", Some("running")) => "running",
            ("approval.decided" | "approval.expiring", Some("awaiting_approval")) => "awaiting_approval",
            ("approval.expired" | "approval.canceled", Some(state)) if state != "succeeded" => state,
            (kind, from) => panic!("{context}: {kind} after {from:?} in {kinds:?}"),
        });
    }
    assert_eq!(status, Some(run.status.as_str()), "{context}: the log ends where the run ended: {kinds:?}");
    let last = events.last().unwrap();
    assert_eq!(last["data"]["status"], run.status.as_str(), "{context}: the terminal event shows the ended run");
    assert_eq!(last["data"]["output"].as_str(), run.output.as_deref());
    // Work done again after a crash is never reported twice.
    let (_, _, expected) = KINDS[kind];
    let expected_lines: Vec<&str> = if expected.is_empty() { vec!["x"] } else { expected.split('\n').collect() };
    if run.status == RunStatus::Succeeded && KINDS[kind].0 == "script" {
        assert_eq!(output, expected_lines, "{context}: one output.appended per line");
    } else {
        assert!(expected_lines.starts_with(&output) || KINDS[kind].0 == "echo", "{context}: {output:?}");
    }
}

pub(super) async fn run_schedule(seed: u64, tally: &mut Tally) {
    let mut rng = StdRng::seed_from_u64(seed);
    let world = World::new().await;
    let runs = rng.random_range(1..=3usize);
    let kinds: Vec<usize> = (0..runs).map(|_| rng.random_range(0..KINDS.len())).collect();
    let approving: Vec<usize> = (0..runs).filter(|i| KINDS[kinds[*i]].1.contains("approve")).collect();
    // A victim that will run, and a call it makes: creates make 2 (insert,
    // send), workers, deciders and sweeps at least 3.
    let victim = match rng.random_range(0..4) {
        0 => Victim::Create(rng.random_range(0..runs)),
        2 if !approving.is_empty() => Victim::Decide(approving[rng.random_range(0..approving.len())]),
        3 => Victim::SweeperPass(rng.random_range(0..2)),
        _ => Victim::Delivery(rng.random_range(0..runs)),
    };
    let calls = if matches!(victim, Victim::Create(_)) { 2 } else { 3 };
    let mut crash = Crash { victim, at: rng.random_range(0..calls), after: rng.random_bool(0.5), plan: None };

    // Clients create their runs; a 503 is retried with the same key by a
    // client talking to a restarted process.
    let mut accepted: Vec<(RunId, usize)> = Vec::new();
    for (i, kind) in kinds.iter().enumerate() {
        let (agent, input, _) = KINDS[*kind];
        let body = json!({"agent": agent, "input": input});
        let key = format!("create-{i}");
        let plan = crash.plan(Victim::Create(i));
        let (mut status, mut reply) =
            world.call(&world.api(plan), "POST", "/v1/agent/runs", body.clone(), Some(&key)).await;
        if status == 503 {
            tally.client_retries += 1;
            (status, reply) =
                world.call(&world.api(Arc::new(Healthy)), "POST", "/v1/agent/runs", body, Some(&key)).await;
        }
        assert_eq!(status, 201, "seed {seed}: {reply}");
        accepted.push((reply["id"].as_str().unwrap().parse().unwrap(), *kind));
        if rng.random_bool(0.3) {
            // A duplicate message, as SQS may deliver.
            tally.duplicate_messages += 1;
            let owner = Owner::parse("sim").unwrap();
            world.queue.enqueue(&RunMessage { run_id: accepted.last().unwrap().0, owner }).await.unwrap();
        }
    }
    tally.runs += accepted.len();

    let (_stop_sender, stop) = watch::channel(false);
    let mut terminal: BTreeMap<RunId, Run> = BTreeMap::new();
    let mut deliveries = 0usize;
    let started = world.clock.now();
    let limit = Duration::from_secs(300);
    for pass in 0.. {
        for (message_id, message) in world.queue.receive() {
            let plan = crash.plan(Victim::Delivery(deliveries));
            deliveries += 1;
            if world.worker(plan).process(&message, &stop).await.is_ok() {
                world.queue.ack(message_id);
            }
        }
        let plan = crash.plan(Victim::SweeperPass(pass));
        if let Ok(report) = world.sweeper(plan).sweep().await {
            tally.sweeper_enqueues += report.enqueued;
        }
        for message in world.queue.take_dead_letters() {
            tally.dead_lettered += 1;
            abandon_dead_letter(world.store.as_ref(), world.clock.as_ref(), &message).await.unwrap();
        }
        // Humans approve whatever waits, retrying a 503 on the next pass:
        // one by one, or (odd seeds) all at once in a batch.
        let mut batch = Vec::new();
        for (i, (id, _)) in accepted.iter().enumerate() {
            let run = world.run(*id).await;
            // An approval with a veto window is left to the sweeper.
            for approval in run
                .approvals
                .iter()
                .filter(|a| a.status == agent_runs_domain::ApprovalStatus::Pending && a.auto_approves_at.is_none())
            {
                if seed % 2 == 1 {
                    batch.push((i, json!({"run_id": id, "approval_id": approval.id, "decision": "approve"})));
                    continue;
                }
                let plan = crash.plan(Victim::Decide(i));
                let path = format!("/v1/agent/runs/{id}/approvals/{}", approval.id);
                let (status, reply) =
                    world.call(&world.api(plan), "POST", &path, json!({"decision": "approve"}), None).await;
                assert!(matches!(status, 200 | 503), "seed {seed}: {status} {reply}");
            }
        }
        if let Some((first, _)) = batch.first() {
            let plan = crash.plan(Victim::Decide(*first));
            let decisions: Vec<Value> = batch.into_iter().map(|(_, decision)| decision).collect();
            let body = json!({"decisions": decisions});
            let (status, reply) = world.call(&world.api(plan), "POST", "/v1/approvals/batch", body, None).await;
            assert!(matches!(status, 200 | 503), "seed {seed}: {status} {reply}");
        }
        // A terminal run never changes again.
        let mut all_terminal = true;
        for (id, _) in &accepted {
            let run = world.run(*id).await;
            match terminal.get(id) {
                Some(seen) => assert_eq!(&run, seen, "seed {seed}: a terminal run changed"),
                None if run.status.is_terminal() => {
                    terminal.insert(*id, run);
                }
                None => all_terminal = false,
            }
        }
        if all_terminal && world.queue.is_empty() {
            break;
        }
        assert!(
            world.clock.now().since(started) < limit,
            "seed {seed} ({victim:?} at call {}, after: {}): runs still not finished after {limit:?}",
            crash.at,
            crash.after
        );
        world.clock.advance(STEP);
    }
    tally.deliveries += deliveries;
    tally.crashes += usize::from(crash.happened());
    world.assert_active_count_is_true(&format!("seed {seed}")).await;
    tally.latest_finish = tally.latest_finish.max(world.clock.now().since(started));

    let writes = world.store.hooks().0.lock().unwrap().clone();
    for (id, kind) in &accepted {
        let run = &terminal[id];
        assert_eq!(writes.get(id), Some(&1), "seed {seed}: a run must end exactly once");
        let (_, _, expected) = KINDS[*kind];
        match run.status {
            RunStatus::Succeeded => assert_eq!(run.output.as_deref(), Some(expected), "seed {seed}"),
            RunStatus::Failed if *kind == 3 => assert_eq!(run.error.as_deref(), Some("it broke")),
            // Crashes may exhaust a run's attempts; that failure must say so.
            RunStatus::Failed => {
                assert!(run.error.as_deref().unwrap().contains("attempts"), "seed {seed}: {:?}", run.error)
            }
            other => panic!("seed {seed}: run ended {other:?}"),
        }
    }
    for (id, kind) in &accepted {
        assert_log_matches_the_run(&world, &terminal[id], *kind, &format!("seed {seed}, {victim:?}")).await;
    }
}

#[tokio::test(flavor = "current_thread")]
pub(super) async fn crash_at_every_step_loses_nothing_and_never_changes_a_finished_run() {
    let mut tally = Tally::default();
    for seed in 0..SCHEDULES {
        run_schedule(seed, &mut tally).await;
        tally.schedules += 1;
    }
    let report = format!("crash schedules: {tally:#?}\n");
    print!("{report}");
    std::fs::write(concat!(env!("CARGO_TARGET_TMPDIR"), "/reliability-crashes.txt"), report).unwrap();
    assert_eq!(tally.schedules, SCHEDULES);
    assert!(tally.crashes >= 1_000, "at least 1,000 schedules crash a process: {tally:?}");
    assert!(tally.client_retries > 0 && tally.sweeper_enqueues > 0 && tally.duplicate_messages > 0);
}
