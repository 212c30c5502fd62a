//! No run is ever lost, stuck or corrupted: seeded, deterministic schedules
//! of crashes at every store and queue call of the API, the workers and the
//! sweeper, with at-least-once redelivery, duplicates and a dead-letter
//! queue; then races between real concurrent tasks, and outages.
//!
//! Everything runs on the real SQLite store; time is a manual clock.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_runs_shared::agents::AgentRegistry;
use agent_runs_shared::api::{Api, ApiLimits, ApiParts};
use agent_runs_shared::auth::{Authenticator, generate_key};
use agent_runs_shared::domain::{
    Clock, ExecutionPolicy, IdGenerator, KeyId, ManualClock, Owner, Run, RunId, RunStatus, Timestamp,
};
use agent_runs_shared::queue::{QueueError, RunMessage, RunQueue};
use agent_runs_shared::store::{
    Answer, Call, EventLog, Hooks, KeyStore, Layered, ListRequest, RunLists, RunStore, Store, StoreError,
};
use agent_runs_shared::worker::{Outcome, Sweeper, Worker, abandon_dead_letter};
use agent_runs_store_sqlite::{Durability, SqliteStore};
use agent_runs_testkit::faults::{CrashAt, FaultPlan, Faults, FaultyQueue, Healthy, RandomFailures};
use agent_runs_testkit::stores::ActiveRuns;
use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Enough schedules that at least 1,000 of them crash a process (some pick a
/// call their victim never makes).
const SCHEDULES: u64 = 1_300;
const VISIBILITY: Duration = Duration::from_secs(30);
const MAX_RECEIVES: u32 = 5;
/// Simulated time between passes of the workers, the sweeper and the humans.
const STEP: Duration = Duration::from_secs(5);

/// SQS as the worker sees it: at-least-once, a visibility timeout, and a
/// dead-letter queue after a number of receives.
struct SimQueue {
    clock: Arc<ManualClock>,
    pending: Mutex<Vec<(u64, RunMessage, Timestamp, u32)>>,
    next_id: Mutex<u64>,
    dead: Mutex<Vec<RunMessage>>,
}

impl SimQueue {
    fn new(clock: Arc<ManualClock>) -> Arc<SimQueue> {
        Arc::new(SimQueue { clock, pending: Mutex::default(), next_id: Mutex::default(), dead: Mutex::default() })
    }

    /// Every visible message, now invisible for the visibility timeout.
    fn receive(&self) -> Vec<(u64, RunMessage)> {
        let now = self.clock.now();
        let mut pending = self.pending.lock().unwrap();
        let mut dead = self.dead.lock().unwrap();
        pending.retain(|(_, message, visible_at, receives)| {
            let to_dead_letters = *visible_at <= now && *receives >= MAX_RECEIVES;
            if to_dead_letters {
                dead.push(message.clone());
            }
            !to_dead_letters
        });
        let mut received = Vec::new();
        for (id, message, visible_at, receives) in pending.iter_mut() {
            if *visible_at <= now {
                *visible_at = now.plus(VISIBILITY);
                *receives += 1;
                received.push((*id, message.clone()));
            }
        }
        received
    }

    fn ack(&self, id: u64) {
        self.pending.lock().unwrap().retain(|(pending, ..)| *pending != id);
    }

    fn is_empty(&self) -> bool {
        self.pending.lock().unwrap().is_empty()
    }

    fn take_dead_letters(&self) -> Vec<RunMessage> {
        std::mem::take(&mut *self.dead.lock().unwrap())
    }
}

#[async_trait]
impl RunQueue for SimQueue {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError> {
        let mut next_id = self.next_id.lock().unwrap();
        *next_id += 1;
        self.pending.lock().unwrap().push((*next_id, message.clone(), self.clock.now(), 0));
        Ok(())
    }
}

/// Counts the writes that end each run: exactly one per run, ever.
#[derive(Default)]
struct TerminalWrites(Mutex<HashMap<RunId, usize>>);

#[async_trait]
impl Hooks for TerminalWrites {
    type Seen = ();

    async fn before(&self, _call: Call<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn after(&self, call: Call<'_>, (): (), answer: Answer) -> Option<StoreError> {
        if let Call::Update(run) = call
            && answer.written == 1
            && run.status.is_terminal()
        {
            *self.0.lock().unwrap().entry(run.id).or_default() += 1;
        }
        None
    }
}

type Observed = Layered<SqliteStore, TerminalWrites>;

/// Which process crashes, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Create(usize),
    Delivery(usize),
    Decide(usize),
    SweeperPass(usize),
}

#[derive(Debug, Default)]
struct Tally {
    schedules: u64,
    runs: usize,
    crashes: usize,
    client_retries: usize,
    deliveries: usize,
    duplicate_messages: usize,
    dead_lettered: usize,
    sweeper_enqueues: usize,
    latest_finish: Duration,
}

struct World {
    _dir: tempfile::TempDir,
    store: Arc<Observed>,
    keys: Arc<SqliteStore>,
    queue: Arc<SimQueue>,
    clock: Arc<ManualClock>,
    policy: ExecutionPolicy,
    agents: AgentRegistry,
    key: String,
}

impl World {
    async fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = Arc::new(SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap());
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_795_303_478_123)));
        let issued = generate_key(
            KeyId::from_ulid(IdGenerator::default().ulid_at(clock.now())),
            Owner::parse("sim").unwrap(),
            None,
            clock.now(),
        );
        sqlite.put_key(&issued.stored).await.unwrap();
        World {
            _dir: dir,
            store: Arc::new(Layered::new(sqlite.clone(), TerminalWrites::default())),
            keys: sqlite,
            queue: SimQueue::new(clock.clone()),
            clock,
            policy: ExecutionPolicy::default(),
            agents: AgentRegistry::builtin("echo").unwrap(),
            key: issued.secret,
        }
    }

    fn store_for(&self, plan: Arc<dyn FaultPlan>) -> Arc<dyn Store> {
        Faults::store(self.store.clone(), plan)
    }

    fn api(&self, plan: Arc<dyn FaultPlan>) -> Api {
        self.api_with_queue(plan.clone(), Arc::new(FaultyQueue::new(self.queue.clone(), plan)))
    }

    fn api_with_queue(&self, plan: Arc<dyn FaultPlan>, queue: Arc<dyn RunQueue>) -> Api {
        Api::new(ApiParts {
            runs: self.store_for(plan),
            queue,
            auth: Authenticator::new(self.keys.clone(), Duration::ZERO),
            agents: self.agents.clone(),
            clock: self.clock.clone(),
            policy: self.policy.clone(),
            limits: ApiLimits::default(),
            webhooks: self.keys.clone(),
            webhook_allow_private: false,
        })
    }

    fn worker(&self, plan: Arc<dyn FaultPlan>) -> Worker {
        Worker::new(self.store_for(plan), self.agents.clone(), self.clock.clone(), self.policy.clone())
    }

    fn sweeper(&self, plan: Arc<dyn FaultPlan>) -> Sweeper {
        let queue = Arc::new(FaultyQueue::new(self.queue.clone(), plan.clone()));
        Sweeper::new(self.store_for(plan), queue, self.clock.clone(), self.policy.clone())
    }

    async fn call(
        &self,
        api: &Api,
        method: &str,
        path: &str,
        body: Value,
        idempotency_key: Option<&str>,
    ) -> (u16, Value) {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {}", self.key))
            .header("content-type", "application/json");
        if let Some(key) = idempotency_key {
            request = request.header("idempotency-key", key);
        }
        let response = api.handle(request.body(Bytes::from(body.to_string())).unwrap()).await;
        let status = response.status().as_u16();
        assert!(status != 500, "never a 500: {}", String::from_utf8_lossy(response.body()));
        (status, serde_json::from_slice(response.body()).unwrap())
    }

    async fn run(&self, id: RunId) -> Run {
        self.store.get(&Owner::parse("sim").unwrap(), id).await.unwrap().expect("an accepted run is never lost")
    }

    /// Every run of the owner, newest first.
    async fn all_runs(&self) -> Vec<Run> {
        let owner = Owner::parse("sim").unwrap();
        let mut runs: Vec<Run> = Vec::new();
        loop {
            let request = ListRequest { status: None, before: runs.last().map(|run| run.id), limit: 100 };
            let page = self.store.list(&owner, request).await.unwrap();
            runs.extend(page.runs);
            if !page.has_more {
                return runs;
            }
        }
    }

    /// The store's count of active runs is the number of runs not yet ended.
    async fn assert_active_count_is_true(&self, context: &str) {
        let active = self.all_runs().await.iter().filter(|run| !run.status.is_terminal()).count();
        let counted = self.store.active_runs(&Owner::parse("sim").unwrap()).await.unwrap();
        assert_eq!(counted, active as i64, "{context}: the active-run count drifted from the runs");
    }
}

/// The kinds of run a schedule mixes, with the output each must end with.
const KINDS: [(&str, &str, &str); 4] = [
    ("echo", "hello", "hello"),
    ("script", "say a\nsay b\nsay c", "a\nb\nc"),
    ("script", "say before\napprove Ship it\nsay after", "before\napproved: Ship it\nafter"),
    ("script", "say x\nfail it broke", ""),
];

/// The one crash of a schedule: the first time its victim runs.
struct Crash {
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
async fn assert_log_matches_the_run(world: &World, run: &Run, kind: usize, context: &str) {
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

async fn run_schedule(seed: u64, tally: &mut Tally) {
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
            for approval in
                run.approvals.iter().filter(|a| a.status == agent_runs_shared::domain::ApprovalStatus::Pending)
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
async fn crash_at_every_step_loses_nothing_and_never_changes_a_finished_run() {
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

/// One run, driven to `awaiting_approval` on a fresh world.
async fn awaiting_run(world: &World) -> (RunId, String) {
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

const RACES: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn races_have_exactly_one_winner_and_the_loser_gets_409_or_drops_the_message() {
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
async fn with_a_share_of_calls_failing_clients_see_only_503_and_nothing_is_lost() {
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

/// A queue whose send first does `during` (the client's retry, or a worker
/// that got the message) and then reports a failure: a slow send that
/// times out, or with `deliver` an ambiguous one that did deliver.
struct SendThenFail {
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
async fn a_replay_answered_while_the_first_send_hangs_keeps_its_run_when_that_send_fails() {
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
async fn a_send_that_delivers_but_reports_a_failure_never_deletes_the_run_it_started() {
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
async fn a_create_whose_send_fails_is_undone_and_its_key_is_free_again() {
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
async fn a_create_whose_undo_fails_answers_by_what_the_store_holds() {
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
async fn a_create_whose_write_may_have_landed_sends_its_run_all_the_same() {
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
async fn a_create_of_unknown_outcome_whose_send_hangs_still_answers() {
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
struct WritesFailAfter {
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
async fn one_long_lived_worker_takes_over_a_run_its_own_dead_attempt_left_running() {
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
async fn the_default_route_serves_no_operation_only_404_and_405() {
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
async fn a_last_decision_whose_answer_was_lost_still_sends_the_run() {
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
async fn a_decision_answered_503_after_it_landed_is_sent_by_its_retry() {
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
async fn a_second_park_decided_with_a_lost_answer_is_sent_within_the_spacing() {
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
async fn a_batch_whose_answer_was_lost_still_sends_its_runs_once() {
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
async fn a_replay_whose_pin_answer_was_lost_still_sends_the_run() {
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
