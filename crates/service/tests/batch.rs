//! Batch decisions against a store where another person decides the same
//! runs between the batch's read and its write.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{
    ApprovalRequest, Clock, Decision, DecisionRequest, ExecutionPolicy, KeyId, ManualClock, Owner, Run, RunId, Scopes,
    Timestamp,
};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::queue::InProcessQueue;
use agent_runs_ports::store::{Answer, Call, Hooks, Layered, RunStore, StoreError};
use agent_runs_service::auth::Principal;
use agent_runs_service::commands::{BatchDecision, RunCommands};
use async_trait::async_trait;
use ulid::Ulid;

const T0: i64 = 1_795_303_478_123;

/// Before a SQLite store's first batch write, makes these decisions by
/// another key (so the batch conflicts).
struct Raced {
    store: Arc<SqliteStore>,
    before_first_batch: Mutex<Option<Vec<(RunId, Decision)>>>,
}

#[async_trait]
impl Hooks for Raced {
    type Seen = ();

    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        if !matches!(call, Call::UpdateBatch(_)) {
            return Ok(());
        }
        let race = self.before_first_batch.lock().unwrap().take();
        for (run_id, decision) in race.into_iter().flatten() {
            let mut run = self.store.get(&owner(), run_id).await.unwrap().unwrap();
            let request = DecisionRequest { decision, comment: None, seen_sha256: None, decided_by: Some(key(9)) };
            run.decide(run.approvals[0].id, request, Timestamp::from_millis(T0 + 50), &ExecutionPolicy::default())
                .unwrap();
            self.store.update(&mut run).await.unwrap();
        }
        Ok(())
    }

    async fn after(&self, _call: Call<'_>, (): (), _answer: Answer) -> Option<StoreError> {
        None
    }
}

fn owner() -> Owner {
    Owner::parse("acme").unwrap()
}

/// The key `n` of the owner, deciding.
fn decider(n: u128) -> Principal {
    Principal {
        owner: owner(),
        key_id: key(n),
        scopes: Scopes::all(),
        key_name: None,
        key_created_at: Timestamp::from_millis(T0),
    }
}

/// The commands over `store`, with the built-in agents.
fn commands(store: Arc<dyn RunStore>, clock: Arc<dyn Clock>, policy: ExecutionPolicy) -> RunCommands {
    let (queue, _receiver) = InProcessQueue::new();
    let agents = AgentRegistry::builtin("echo").unwrap();
    RunCommands::new(store, Arc::new(queue), agents, clock, policy, 100)
}

fn key(n: u128) -> KeyId {
    KeyId::from_ulid(Ulid::from_parts(T0 as u64, n))
}

/// A run awaiting one approval, stored.
async fn awaiting(store: &SqliteStore, n: u128) -> Run {
    let policy = ExecutionPolicy::default();
    let id = RunId::from_ulid(Ulid::from_parts(T0 as u64, n));
    let mut run = Run::new(id, owner(), "script".into(), "x".into(), BTreeMap::new(), &policy);
    store.insert(&mut run, None, 100).await.unwrap();
    run.claim("w", Timestamp::from_millis(T0 + 10), &policy).unwrap();
    let approval = agent_runs_domain::ApprovalId::from_ulid(Ulid::from_parts(T0 as u64 + 20, n));
    run.park(
        "w",
        vec![(approval, ApprovalRequest::action("go"))],
        serde_json::json!({}),
        Timestamp::from_millis(T0 + 20),
        &policy,
    )
    .unwrap();
    store.update(&mut run).await.unwrap();
    run
}

#[tokio::test]
async fn a_batch_beaten_by_another_key_does_not_claim_to_have_recorded_anything() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap());
    let (first, second) = (awaiting(&sqlite, 1).await, awaiting(&sqlite, 2).await);
    // Another key approves the first run (as the batch will) and rejects the second.
    let race = vec![(first.id, Decision::Approve), (second.id, Decision::Reject)];
    let raced = Raced { store: sqlite.clone(), before_first_batch: Mutex::new(Some(race)) };
    let store = Arc::new(Layered::new(sqlite, raced));
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0 + 100)));
    let commands = commands(store.clone(), clock, ExecutionPolicy::default());
    let approve = |index, run: &Run| {
        let request =
            DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: Some(key(1)) };
        BatchDecision { index, run_id: run.id, approval_id: run.approvals[0].id, request }
    };
    let batch = vec![approve(0, &first), approve(1, &second)];
    let refused = commands.decide_batch(&decider(1), batch).await.unwrap_err();
    assert_eq!(refused.index, Some(1), "the second run was rejected by the other key");
    assert!(!refused.partly_recorded, "this batch wrote nothing: the first run's approval is the other key's");
    let stored = store.get(&owner(), first.id).await.unwrap().unwrap();
    assert_eq!(stored.approvals[0].resolved_by, Some(agent_runs_domain::Resolver::Key(key(9))));
}

/// A clock that reads `first` once, then a month later: whatever takes
/// time between a decision's arrival and its write.
struct SlowRequest(Mutex<bool>);

impl agent_runs_domain::Clock for SlowRequest {
    fn now(&self) -> Timestamp {
        let mut read = self.0.lock().unwrap();
        let later = std::mem::replace(&mut *read, true);
        Timestamp::from_millis(T0 + 100 + if later { 30 * 24 * 3_600_000 } else { 0 })
    }
}

/// An answer that arrives before its question expires is recorded, however
/// long its check against the schema takes: a decision is judged at the
/// time it arrived.
#[tokio::test]
async fn an_answer_is_judged_at_the_time_it_arrived_not_after_its_check() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap());
    let policy = ExecutionPolicy::default();
    let id = RunId::from_ulid(Ulid::from_parts(T0 as u64, 7));
    let mut run = Run::new(id, owner(), "script".into(), "x".into(), BTreeMap::new(), &policy);
    store.insert(&mut run, None, 100).await.unwrap();
    run.claim("w", Timestamp::from_millis(T0 + 10), &policy).unwrap();
    let approval = agent_runs_domain::ApprovalId::from_ulid(Ulid::from_parts(T0 as u64 + 20, 7));
    let asked = ApprovalRequest::question("Which env?", serde_json::json!({"enum": ["staging", "prod"]}));
    run.park("w", vec![(approval, asked)], serde_json::json!({}), Timestamp::from_millis(T0 + 20), &policy).unwrap();
    store.update(&mut run).await.unwrap();
    let commands = commands(store.clone(), Arc::new(SlowRequest(Mutex::new(false))), policy);
    let request = DecisionRequest {
        decision: Decision::Answer(serde_json::json!("prod")),
        comment: None,
        seen_sha256: None,
        decided_by: Some(key(1)),
    };
    let decided =
        commands.decide(&decider(1), id, approval, request).await.unwrap_or_else(|_| panic!("expired after arriving"));
    assert_eq!(decided.approvals[0].status, agent_runs_domain::ApprovalStatus::Answered);
    assert_eq!(decided.approvals[0].resolved_at, Some(Timestamp::from_millis(T0 + 100)));
}
