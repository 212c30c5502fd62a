//! The worker protocol against the real SQLite store: claims, duplicates,
//! cancels mid-run, takeover after a lease expires, and the sweeper.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{Clock, ExecutionPolicy, IdGenerator, ManualClock, Owner, Run, RunId, RunStatus, Timestamp};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::queue::{InProcessQueue, RunMessage, RunQueue};
use agent_runs_ports::store::{Answer, Call, EventLog, Hooks, Layered, RunStore, StoreError};
use agent_runs_service::worker::{MAX_SWEEP_FAILURES, Outcome, Sweeper, Worker};
use agent_runs_testkit::faults::{Fault, Faults, OnCalls};
use tokio::sync::watch;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
    policy: ExecutionPolicy,
    agents: AgentRegistry,
    ids: IdGenerator,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap();
        Fixture {
            _dir: dir,
            store: Arc::new(store),
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(1_795_303_478_123))),
            policy: ExecutionPolicy::default(),
            agents: AgentRegistry::builtin("echo").unwrap(),
            ids: IdGenerator::default(),
        }
    }

    fn worker(&self) -> Worker {
        Worker::new(self.store.clone(), self.agents.clone(), self.clock.clone(), self.policy.clone())
    }

    async fn create(&self, agent: &str, input: &str) -> RunMessage {
        let id = RunId::from_ulid(self.ids.ulid_at(self.clock.now()));
        let owner = Owner::parse("acme").unwrap();
        let mut run = Run::new(id, owner.clone(), agent.into(), input.into(), BTreeMap::new(), &self.policy);
        self.store.insert(&mut run, None, 1_000).await.unwrap();
        RunMessage { run_id: id, owner }
    }

    async fn run(&self, message: &RunMessage) -> Run {
        self.store.get(&message.owner, message.run_id).await.unwrap().unwrap()
    }
}

fn running() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    std::mem::forget(sender);
    receiver
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_delivered_five_times_at_once_runs_the_agent_once() {
    let fixture = Fixture::new();
    let message = fixture.create("script", "say once\nsleep 100").await;
    let stop = running();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let (worker, message, stop) = (fixture.worker(), message.clone(), stop.clone());
            tokio::spawn(async move { worker.process(&message, &stop).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let outcomes: Vec<Outcome> = outcomes.into_iter().map(Result::unwrap).collect();
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Succeeded).count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Dropped).count(), 4, "{outcomes:?}");
    let run = fixture.run(&message).await;
    assert_eq!(run.output.as_deref(), Some("once"));
    assert_eq!(run.attempts, 1);
    // A late duplicate of a finished run is dropped and changes nothing.
    assert_eq!(fixture.worker().process(&message, &stop).await.unwrap(), Outcome::Dropped);
    assert_eq!(fixture.run(&message).await, run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_during_the_run_stops_the_worker_without_overwriting() {
    let fixture = Fixture::new();
    let message = fixture.create("script", "say a\nsleep 1000\nsay b").await;
    let worker = fixture.worker();
    let stop = running();
    let processing = worker.process(&message, &stop);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut run = fixture.run(&message).await;
        assert_eq!(run.status, RunStatus::Running);
        run.cancel(fixture.clock.now()).unwrap();
        fixture.store.update(&mut run).await.unwrap();
        run
    };
    let (outcome, canceled) = tokio::join!(processing, cancel);
    assert_eq!(outcome.unwrap(), Outcome::LostLease);
    assert_eq!(fixture.run(&message).await, canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_the_sweeper_requeues_it() {
    let fixture = Fixture::new();
    let message = fixture.create("echo", "hello").await;
    // A worker claims the run and dies: simulate by claiming by hand.
    let mut run = fixture.run(&message).await;
    run.claim("dead-worker", fixture.clock.now(), &fixture.policy).unwrap();
    fixture.store.update(&mut run).await.unwrap();

    let (queue, receiver) = InProcessQueue::new();
    let queue: Arc<dyn RunQueue> = Arc::new(queue);
    let sweeper = Sweeper::new(fixture.store.clone(), queue, fixture.clock.clone(), fixture.policy.clone());
    let stop = running();
    assert_eq!(fixture.worker().process(&message, &stop).await.unwrap(), Outcome::Dropped, "the lease is live");
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 0);

    fixture.clock.advance(fixture.policy.lease);
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 1);
    let redelivered = receiver.receive().await.unwrap();
    assert_eq!(redelivered, message);
    assert_eq!(fixture.worker().process(&redelivered, &stop).await.unwrap(), Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!(run.attempts, 2);
    assert_eq!(run.output.as_deref(), Some("hello"));
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 0, "terminal runs leave the sweeper's view");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_run_whose_message_was_lost_is_enqueued_after_a_minute() {
    let fixture = Fixture::new();
    let message = fixture.create("echo", "lost").await;
    let (queue, receiver) = InProcessQueue::new();
    let sweeper = Sweeper::new(fixture.store.clone(), Arc::new(queue), fixture.clock.clone(), fixture.policy.clone());
    fixture.clock.advance(Duration::from_secs(59));
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 0);
    fixture.clock.advance(Duration::from_secs(1));
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 1);
    assert_eq!(receiver.receive().await.unwrap(), message);
    assert_eq!(sweeper.sweep().await.unwrap().enqueued, 0, "not again until another minute passes");
}

/// Hampers the SQLite store: no write of the `broken` run goes through
/// unless it ends the run (as with a record the store cannot encode), and
/// each read of a run takes `slow_reads`. It counts the settlings of counts.
#[derive(Default)]
struct Hampered {
    broken: Option<RunId>,
    slow_reads: Duration,
    /// The time each settling had left before its deadline.
    settlings: std::sync::Mutex<Vec<Duration>>,
}

impl Hampered {
    fn over(self, store: &Arc<SqliteStore>) -> Arc<Layered<SqliteStore, Hampered>> {
        Arc::new(Layered::new(store.clone(), self))
    }
}

#[async_trait::async_trait]
impl Hooks for Hampered {
    type Seen = ();

    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        match call {
            Call::Update(run) if Some(run.id) == self.broken && !run.status.is_terminal() => {
                return Err(StoreError::Defect("cannot encode run".into()));
            }
            Call::Get(_) => tokio::time::sleep(self.slow_reads).await,
            Call::SettleCounts { deadline } => {
                let left =
                    deadline.map_or(Duration::MAX, |deadline| deadline.saturating_duration_since(Instant::now()));
                self.settlings.lock().unwrap().push(left);
            }
            _ => {}
        }
        Ok(())
    }

    async fn after(&self, _call: Call<'_>, (): (), _answer: Answer) -> Option<StoreError> {
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_the_sweeper_cannot_handle_blocks_no_other_and_is_failed_in_the_end() {
    let fixture = Fixture::new();
    // The broken run is due first, so a pass meets it before the other.
    let broken = fixture.create("echo", "broken").await;
    fixture.clock.advance(Duration::from_millis(5));
    let healthy = fixture.create("echo", "healthy").await;
    let store = Hampered { broken: Some(broken.run_id), ..Hampered::default() }.over(&fixture.store);
    let (queue, receiver) = InProcessQueue::new();
    let sweeper = Sweeper::new(store, Arc::new(queue), fixture.clock.clone(), fixture.policy.clone());

    fixture.clock.advance(fixture.policy.requeue_after);
    let report = sweeper.sweep().await.unwrap();
    assert_eq!((report.enqueued, report.skipped, report.failed), (1, 1, 0), "{report:?}");
    assert_eq!(receiver.receive().await.unwrap(), healthy, "the run behind the broken one is sent");
    for pass in 2..MAX_SWEEP_FAILURES {
        let report = sweeper.sweep().await.unwrap();
        assert_eq!((report.skipped, report.failed), (1, 0), "pass {pass}: {report:?}");
    }
    let report = sweeper.sweep().await.unwrap();
    assert_eq!((report.skipped, report.failed), (1, 1), "{report:?}");
    let run = fixture.run(&broken).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.unwrap().contains("could not be recovered"));
    assert_eq!(sweeper.sweep().await.unwrap(), Default::default(), "nothing is due any more");
}

/// A backlog of due runs larger than a pass never starves the recount of
/// the active-run counts: it has its share of the pass's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_whose_due_runs_outlast_it_still_settles_the_counts() {
    let fixture = Fixture::new();
    for i in 0..40 {
        fixture.create("echo", &format!("backlog {i}")).await;
    }
    let store = Hampered { slow_reads: Duration::from_millis(100), ..Hampered::default() }.over(&fixture.store);
    let (queue, _receiver) = InProcessQueue::new();
    let sweeper = Sweeper::new(store.clone(), Arc::new(queue), fixture.clock.clone(), fixture.policy.clone());
    fixture.clock.advance(fixture.policy.requeue_after);
    // 40 reads of 100 ms outlast a pass of 2 s, whose due runs have 1.5 s.
    let report = sweeper.sweep_until(Some(Instant::now() + Duration::from_secs(2))).await.unwrap();
    assert!(report.unfinished && report.enqueued < 40, "the backlog outlasts the pass: {report:?}");
    let settlings = store.hooks().settlings.lock().unwrap().clone();
    assert_eq!(settlings.len(), 1, "the counts were settled all the same");
    assert!(settlings[0] > Duration::ZERO, "with time left for them: {settlings:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_record_cannot_be_read_never_blocks_the_others_and_keeps_its_place() {
    let fixture = Fixture::new();
    let unreadable = fixture.create("echo", "garbled").await;
    fixture.clock.advance(Duration::from_millis(5));
    let healthy = fixture.create("echo", "healthy").await;
    let file = rusqlite::Connection::open(fixture._dir.path().join("runs.db")).unwrap();
    let garbled = file.execute("UPDATE runs SET body = '{\"id\": 7' WHERE id = ?1", [unreadable.run_id.to_string()]);
    assert_eq!(garbled.unwrap(), 1);
    assert!(matches!(fixture.store.get(&unreadable.owner, unreadable.run_id).await, Err(StoreError::Defect(_))));
    let (queue, receiver) = InProcessQueue::new();
    let sweeper = Sweeper::new(fixture.store.clone(), Arc::new(queue), fixture.clock.clone(), fixture.policy.clone());
    assert_eq!(sweeper.enqueue_all_queued().await.unwrap(), 1, "start-up recovery goes past it");
    assert_eq!(receiver.receive().await.unwrap(), healthy);

    fixture.clock.advance(fixture.policy.requeue_after);
    let report = sweeper.sweep().await.unwrap();
    assert_eq!((report.enqueued, report.skipped), (1, 1), "the run behind it is sent: {report:?}");
    for pass in 2..=MAX_SWEEP_FAILURES + 1 {
        let report = sweeper.sweep().await.unwrap();
        assert_eq!((report.skipped, report.failed), (1, 0), "pass {pass}: {report:?}");
    }
    // Unread, it is not ended: ending it could count it twice should a
    // later version read it.
    assert_eq!(fixture.store.active_runs(&unreadable.owner).await.unwrap(), 2);
    let status: String = file
        .query_row("SELECT status FROM runs WHERE id = ?1", [unreadable.run_id.to_string()], |row| row.get(0))
        .unwrap();
    assert_eq!(status, "queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_or_hand_back_whose_answer_was_lost_is_known_for_what_it_did() {
    let fixture = Fixture::new();
    // The claim lands but answers a conflict: the re-read finds this
    // worker's own lease, and the run goes on rather than wait for it to
    // expire. (A script run's claim is written first; echo's goes with its end.)
    let message = fixture.create("script", "say hello").await;
    let store = Faults::store(fixture.store.clone(), OnCalls::nth("update", 1, Fault::ConflictAfter));
    let worker = Worker::new(store, fixture.agents.clone(), fixture.clock.clone(), fixture.policy.clone());
    assert_eq!(worker.process(&message, &running()).await.unwrap(), Outcome::Succeeded);
    assert_eq!(fixture.run(&message).await.attempts, 1);

    // A hand-back (at a stop) lands but answers a conflict: still Released,
    // so whoever stopped the worker sends the run again.
    let message = fixture.create("script", "say a\nsleep 2000\nsay b").await;
    let store = Faults::store(fixture.store.clone(), OnCalls::nth("update", 2, Fault::ConflictAfter));
    let agents = AgentRegistry::builtin("script").unwrap();
    let worker = Worker::new(store, agents, fixture.clock.clone(), fixture.policy.clone());
    let (stop, stopped) = watch::channel(false);
    let stopping = async {
        while fixture.run(&message).await.status != RunStatus::Running {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send(true).unwrap();
    };
    let (outcome, ()) = tokio::join!(worker.process(&message, &stopped), stopping);
    assert_eq!(outcome.unwrap(), Outcome::Released);
    assert_eq!(fixture.run(&message).await.status, RunStatus::Queued);
}

/// The kinds of the run's events, in order.
async fn logged(fixture: &Fixture, message: &RunMessage) -> Vec<String> {
    let page = fixture.store.events(message.run_id, 0, 100).await.unwrap();
    page.events.into_iter().map(|event| event.kind).collect()
}

/// An echo run's claim is written with its end: one write. Should that
/// write land with its answer lost, the run ended once; should another
/// write come first and leave the run queued (a replay's pin, the
/// sweeper's resend), the run is claimed again, the claim written first;
/// should the worker stop before its end, nothing of the attempt is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_runs_claim_goes_with_its_end() {
    let fixture = Fixture::new();
    let message = fixture.create("echo", "once").await;
    assert_eq!(fixture.worker().process(&message, &running()).await.unwrap(), Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!((run.status, run.attempts, run.output.as_deref()), (RunStatus::Succeeded, 1, Some("once")));
    assert_eq!(run.version, 1, "the claim and the end in one write");
    assert_eq!(logged(&fixture, &message).await, ["run.created", "run.started", "run.succeeded"]);

    let message = fixture.create("echo", "lost answer").await;
    let store = Faults::store(fixture.store.clone(), OnCalls::nth("update", 1, Fault::ConflictAfter));
    let worker = Worker::new(store, fixture.agents.clone(), fixture.clock.clone(), fixture.policy.clone());
    assert_eq!(worker.process(&message, &running()).await.unwrap(), Outcome::LostLease);
    let run = fixture.run(&message).await;
    assert_eq!((run.status, run.attempts), (RunStatus::Succeeded, 1));
    assert_eq!(logged(&fixture, &message).await, ["run.created", "run.started", "run.succeeded"]);

    let message = fixture.create("echo", "pinned").await;
    let first = WriteFirst { store: fixture.store.clone(), written: Default::default() };
    let pinning = Arc::new(Layered::new(fixture.store.clone(), first));
    let worker = Worker::new(pinning.clone(), fixture.agents.clone(), fixture.clock.clone(), fixture.policy.clone());
    assert_eq!(worker.process(&message, &running()).await.unwrap(), Outcome::Succeeded);
    assert_eq!(pinning.hooks().written.load(std::sync::atomic::Ordering::SeqCst), 1);
    let run = fixture.run(&message).await;
    // Written: the pin, then the claim and the end, one each.
    assert_eq!((run.status, run.attempts, run.version), (RunStatus::Succeeded, 1, 3));
    assert_eq!(logged(&fixture, &message).await, ["run.created", "run.started", "run.succeeded"]);

    // The end fails before it reaches the store: the hand-back writes
    // nothing either (no `run.started` for a start that never happened),
    // and the message is delivered again.
    let message = fixture.create("echo", "unwritten").await;
    let store = Faults::store(fixture.store.clone(), OnCalls::nth("update", 1, Fault::FailBefore));
    let worker = Worker::new(store, fixture.agents.clone(), fixture.clock.clone(), fixture.policy.clone());
    assert!(worker.process(&message, &running()).await.is_err());
    let run = fixture.run(&message).await;
    assert_eq!((run.status, run.version, run.attempts), (RunStatus::Queued, 0, 0), "nothing written");
    assert_eq!(logged(&fixture, &message).await, ["run.created"]);

    // An agent that says it ends at once but goes on: its claim is written
    // with its first step's state, then its end.
    let agents = fixture.agents.clone().with_agent("twostep", Arc::new(TwoSteps));
    let message = fixture.create("twostep", "go").await;
    let worker = Worker::new(fixture.store.clone(), agents, fixture.clock.clone(), fixture.policy.clone());
    assert_eq!(worker.process(&message, &running()).await.unwrap(), Outcome::Succeeded);
    let run = fixture.run(&message).await;
    assert_eq!((run.status, run.version, run.attempts), (RunStatus::Succeeded, 2, 1), "a save, then the end");
    assert_eq!(logged(&fixture, &message).await, ["run.created", "run.started", "run.succeeded"]);
}

/// Claims to end at once, but takes two steps.
struct TwoSteps;

#[async_trait::async_trait]
impl agent_runs_agents::Agent for TwoSteps {
    fn validate_input(&self, _input: &str) -> Result<(), String> {
        Ok(())
    }

    async fn step(&self, input: agent_runs_agents::StepInput<'_>) -> agent_runs_agents::Step {
        match input.checkpoint {
            None => agent_runs_agents::Step::Continue(serde_json::json!({"first": "done"})),
            Some(_) => agent_runs_agents::Step::succeeded("two steps"),
        }
    }

    fn ends_at_once(&self) -> bool {
        true
    }
}

/// Before the first write that would end a queued run, writes that run
/// itself as a replay's pin or the sweeper's resend would (once).
struct WriteFirst {
    store: Arc<SqliteStore>,
    written: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl Hooks for WriteFirst {
    type Seen = ();

    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        if let Call::Update(run) = call
            && run.status.is_terminal()
            && self.written.load(SeqCst) == 0
        {
            let mut queued = self.store.get(&run.owner, run.id).await?.expect("the run is there");
            assert_eq!(queued.status, RunStatus::Queued);
            queued.resends += 1;
            self.store.update(&mut queued).await?;
            self.written.fetch_add(1, SeqCst);
        }
        Ok(())
    }

    async fn after(&self, _call: Call<'_>, (): (), _answer: Answer) -> Option<StoreError> {
        None
    }
}

/// A run whose agent reports more than its log may hold fails, clearly,
/// with the failure as its last event and the log never past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_would_outgrow_its_log_fails_with_the_limit_named() {
    let mut fixture = Fixture::new();
    fixture.policy.max_events = 16;
    let script: Vec<String> = (0..40).map(|n| format!("say line {n}")).collect();
    let message = fixture.create("script", &script.join("\n")).await;
    assert_eq!(fixture.worker().process(&message, &running()).await.unwrap(), Outcome::Failed);
    let run = fixture.run(&message).await;
    assert_eq!(
        run.error.as_deref(),
        Some("The run was stopped: its log reached this deployment's limit of 16 events.")
    );
    let page = fixture.store.events(message.run_id, 0, 100).await.unwrap();
    let kinds: Vec<&str> = page.events.iter().map(|event| event.kind.as_str()).collect();
    assert!(page.events.len() <= 16, "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"run.failed"));
    assert_eq!(page.events.iter().map(|event| event.seq).collect::<Vec<_>>(), (1..=run.event_seq).collect::<Vec<_>>());
    // What was written is what the agent said, in order, once.
    let said: Vec<String> = page
        .events
        .iter()
        .filter(|event| event.kind == "output.appended")
        .map(|event| {
            serde_json::from_str::<serde_json::Value>(&event.data_json(Default::default()).unwrap()).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        said,
        script[..said.len()].iter().map(|line| line.trim_start_matches("say ").to_owned()).collect::<Vec<_>>()
    );
}

/// A step's text goes into the log as the run goes, not only at its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_run_says_is_in_its_log_while_it_runs() {
    let fixture = Fixture::new();
    let message = fixture.create("script", "say early\nsleep 1500\nsay late").await;
    let worker = fixture.worker();
    let stop = running();
    let processing = worker.process(&message, &stop);
    let watching = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let page = fixture.store.events(message.run_id, 0, 100).await.unwrap();
        page.events.iter().map(|event| event.kind.clone()).collect::<Vec<_>>()
    };
    let (outcome, midway) = tokio::join!(processing, watching);
    assert_eq!(outcome.unwrap(), Outcome::Succeeded);
    assert_eq!(midway, ["run.created", "run.started", "output.appended"], "written while the sleep goes on");
}
