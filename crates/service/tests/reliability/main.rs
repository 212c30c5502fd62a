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

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{
    Clock, ExecutionPolicy, IdGenerator, KeyId, ManualClock, Owner, Run, RunId, RunStatus, Timestamp,
};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::queue::{QueueError, RunMessage, RunQueue};
use agent_runs_ports::store::{
    Answer, Call, EventLog, Hooks, KeyStore, Layered, ListRequest, RunLists, RunStore, Store, StoreError,
};
use agent_runs_service::api::{Api, ApiLimits, ApiParts};
use agent_runs_service::auth::{Authenticator, generate_key};
use agent_runs_service::worker::{Outcome, Sweeper, Worker, abandon_dead_letter};
use agent_runs_testkit::faults::{CrashAt, FaultPlan, Faults, FaultyQueue, Healthy, RandomFailures};
use agent_runs_testkit::stores::ActiveRuns;
use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;

mod lost_answers;
mod races;
mod schedules;

use races::*;

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
            agents: AgentRegistry::builtin("echo").unwrap().with_agent("veto", Arc::new(schedules::VetoAgent)),
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
            shown: Default::default(),
            policies: self.keys.clone(),
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
            let request = ListRequest { status: None, thread: None, before: runs.last().map(|run| run.id), limit: 100 };
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
