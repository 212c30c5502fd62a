//! The store contract: what every RunStore and KeyStore adapter must do.
//! Each check is a function over the traits, run against SQLite and against
//! DynamoDB (the AWS API emulator, table created from template.yaml).

#[path = "support/emulator.rs"]
mod emulator;

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_runs_shared::domain::{
    AgentDefinition, ApprovalId, ApprovalStatus, Decision, DecisionRequest, EventData, ExecutionPolicy, KeyId, Owner,
    Run, RunId, RunStatus, Scope, Scopes, Timestamp,
};
use agent_runs_shared::store::{
    AgentStore, DueRun, DynamoStore, EventLog, EventPage, IdempotencyClaim, InboxRequest, InsertOutcome, KeyStore,
    ListRequest, Migrated, RunLists, RunStore, StoreError, StoredKey, Upkeep,
};
use agent_runs_store_sqlite::{Durability, SqliteStore};
use agent_runs_testkit::faults::AwsError;
use agent_runs_testkit::stores::TestStore;
use ulid::Ulid;

const T0: u64 = 1_795_303_478_123;

fn owner(name: &str) -> Owner {
    Owner::parse(name).unwrap()
}

fn new_run(owner_name: &str, millis_after_t0: u64, random: u128) -> Run {
    let id = RunId::from_ulid(Ulid::from_parts(T0 + millis_after_t0, random));
    Run::new(id, owner(owner_name), "echo".into(), "hi".into(), BTreeMap::new(), &ExecutionPolicy::default())
}

fn claim(key: &str, request: &str, at: u64) -> IdempotencyClaim {
    IdempotencyClaim {
        key_hash: key.into(),
        request_hash: request.into(),
        created_at: Timestamp::from_millis(at as i64),
        expires_at: Timestamp::from_millis((at + 1_000) as i64),
    }
}

async fn insert(store: &dyn TestStore, run: &mut Run) {
    assert!(matches!(store.insert(run, None, 1_000).await.unwrap(), InsertOutcome::Inserted));
}

async fn get_returns_what_insert_wrote_and_only_to_its_owner(store: &dyn TestStore) {
    let mut run = new_run("acme", 0, 1);
    run.metadata.insert("ticket".into(), "OPS-42".into());
    insert(store, &mut run).await;
    assert_eq!(store.get(&owner("acme"), run.id).await.unwrap(), Some(run.clone()));
    assert_eq!(store.get(&owner("other"), run.id).await.unwrap(), None);
    let missing = RunId::from_ulid(Ulid::from_parts(T0, 999));
    assert_eq!(store.get(&owner("acme"), missing).await.unwrap(), None);
}

async fn update_is_conditional_on_the_version_read(store: &dyn TestStore) {
    let mut run = new_run("acme", 0, 2);
    insert(store, &mut run).await;
    let mut first = store.get(&owner("acme"), run.id).await.unwrap().unwrap();
    let mut second = first.clone();
    first.cancel(Timestamp::from_millis(T0 as i64 + 5)).unwrap();
    store.update(&mut first).await.unwrap();
    assert_eq!(first.version, run.version + 1);
    second.status = RunStatus::Running;
    assert!(matches!(store.update(&mut second).await, Err(StoreError::Conflict)));
    assert_eq!(second.version, run.version, "a lost write leaves the caller's version alone");
    let stored = store.get(&owner("acme"), run.id).await.unwrap().unwrap();
    assert_eq!(stored, first);
    // An update to a run that does not exist is a conflict too, and creates nothing.
    let mut ghost = new_run("acme", 0, 3);
    assert!(matches!(store.update(&mut ghost).await, Err(StoreError::Conflict)));
    assert_eq!(store.get(&owner("acme"), ghost.id).await.unwrap(), None);
    // A terminal run is never written again, even with the right version.
    let mut stale = first.clone();
    stale.status = RunStatus::Queued;
    assert!(matches!(store.update(&mut stale).await, Err(StoreError::Conflict)));
    assert_eq!(store.get(&owner("acme"), run.id).await.unwrap().unwrap(), first);
}

async fn idempotency_keys_are_reserved_atomically_with_the_run(store: &dyn TestStore) {
    let mut first = new_run("acme", 0, 10);
    let outcome = store.insert(&mut first, Some(&claim("k1", "r1", T0)), 1_000).await.unwrap();
    assert!(matches!(outcome, InsertOutcome::Inserted));
    let mut second = new_run("acme", 1, 11);
    match store.insert(&mut second, Some(&claim("k1", "r2", T0 + 1)), 1_000).await.unwrap() {
        InsertOutcome::IdempotencyKeyTaken(record) => {
            assert_eq!(record.run_id, first.id);
            assert_eq!(record.request_hash, "r1");
        }
        other => panic!("expected the key to be taken: {other:?}"),
    }
    assert_eq!(store.get(&owner("acme"), second.id).await.unwrap(), None, "nothing written for a taken key");
    // Another owner has its own keys.
    let mut theirs = new_run("other", 1, 12);
    assert!(matches!(
        store.insert(&mut theirs, Some(&claim("k1", "r2", T0 + 1)), 1_000).await.unwrap(),
        InsertOutcome::Inserted
    ));
    // Once expired, the key may be used again.
    let mut later = new_run("acme", 5_000, 13);
    assert!(matches!(
        store.insert(&mut later, Some(&claim("k1", "r3", T0 + 5_000)), 1_000).await.unwrap(),
        InsertOutcome::Inserted
    ));
    // Undoing a create also frees its key.
    assert!(store.undo_create(&later, Some("k1")).await.unwrap());
    assert_eq!(store.get(&owner("acme"), later.id).await.unwrap(), None);
    let mut again = new_run("acme", 5_001, 14);
    assert!(matches!(
        store.insert(&mut again, Some(&claim("k1", "r4", T0 + 5_001)), 1_000).await.unwrap(),
        InsertOutcome::Inserted
    ));
}

async fn insert_refuses_past_the_active_run_limit(store: &dyn TestStore) {
    let mut runs: Vec<Run> = (0..3).map(|i| new_run("busy", i, 20 + i as u128)).collect();
    for run in &mut runs[..2] {
        assert!(matches!(store.insert(run, None, 2).await.unwrap(), InsertOutcome::Inserted));
    }
    assert!(matches!(store.insert(&mut runs[2], None, 2).await.unwrap(), InsertOutcome::TooManyActiveRuns));
    let mut done = runs[0].clone();
    done.cancel(Timestamp::from_millis(T0 as i64 + 10)).unwrap();
    store.update(&mut done).await.unwrap();
    assert!(matches!(store.insert(&mut runs[2], None, 2).await.unwrap(), InsertOutcome::Inserted));
    // A run taken back (its create failed after the insert) frees its place too.
    let mut fourth = new_run("busy", 3, 23);
    assert!(matches!(store.insert(&mut fourth, None, 2).await.unwrap(), InsertOutcome::TooManyActiveRuns));
    assert!(store.undo_create(&runs[1], None).await.unwrap());
    assert!(matches!(store.insert(&mut fourth, None, 2).await.unwrap(), InsertOutcome::Inserted));
    assert_eq!(store.active_runs(&owner("busy")).await.unwrap(), 2);
    // At the limit, a repeated idempotency key still finds its run.
    let mut keyed = new_run("busy", 4, 24);
    let outcome = store.insert(&mut keyed, Some(&claim("at-limit", "request", T0 + 4)), 3).await.unwrap();
    assert!(matches!(outcome, InsertOutcome::Inserted));
    let mut again = new_run("busy", 5, 25);
    match store.insert(&mut again, Some(&claim("at-limit", "request", T0 + 5)), 3).await.unwrap() {
        InsertOutcome::IdempotencyKeyTaken(record) => assert_eq!(record.run_id, keyed.id),
        other => panic!("a replay at the limit is answered as one: {other:?}"),
    }
    assert_eq!(store.active_runs(&owner("busy")).await.unwrap(), 3);
}

/// A create is undone only while its run is exactly as inserted: a run a
/// worker claimed, or one that finished, is kept with its idempotency
/// record, and the active-run count is not touched.
async fn undo_create_keeps_a_run_that_moved_on(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let who = owner("undo");
    let mut claimed = new_run("undo", 0, 30);
    assert!(matches!(
        store.insert(&mut claimed, Some(&claim("u1", "r1", T0)), 2).await.unwrap(),
        InsertOutcome::Inserted
    ));
    let as_inserted = claimed.clone();
    claimed.claim("w", Timestamp::from_millis(T0 as i64 + 1), &policy).unwrap();
    store.update(&mut claimed).await.unwrap();
    assert!(!store.undo_create(&as_inserted, Some("u1")).await.unwrap());
    assert_eq!(store.get(&who, claimed.id).await.unwrap(), Some(claimed.clone()));
    assert_eq!(store.active_runs(&who).await.unwrap(), 1);
    // Its key still answers with it.
    match store.insert(&mut new_run("undo", 1, 31), Some(&claim("u1", "r1", T0 + 1)), 2).await.unwrap() {
        InsertOutcome::IdempotencyKeyTaken(record) => assert_eq!(record.run_id, claimed.id),
        other => panic!("expected the key to be taken: {other:?}"),
    }
    // Finished: still kept, and the count does not go below zero.
    claimed.succeed("w", "done".into(), Timestamp::from_millis(T0 as i64 + 2)).unwrap();
    store.update(&mut claimed).await.unwrap();
    assert_eq!(store.active_runs(&who).await.unwrap(), 0);
    assert!(!store.undo_create(&as_inserted, Some("u1")).await.unwrap());
    assert_eq!(store.get(&who, claimed.id).await.unwrap().unwrap().status, RunStatus::Succeeded);
    assert_eq!(store.active_runs(&who).await.unwrap(), 0);
    // Already undone: nothing more happens.
    let mut undone = new_run("undo", 2, 32);
    insert(store, &mut undone).await;
    assert!(store.undo_create(&undone, None).await.unwrap());
    assert!(!store.undo_create(&undone, None).await.unwrap());
    assert_eq!(store.active_runs(&who).await.unwrap(), 0);
}

async fn list_is_newest_first_with_keyset_pages_and_a_status_filter(store: &dyn TestStore) {
    let who = owner("lister");
    let mut runs: Vec<Run> = (0..7).map(|i| new_run("lister", i * 10, 100 + i as u128)).collect();
    for run in &mut runs {
        insert(store, run).await;
    }
    insert(store, &mut new_run("someone-else", 1, 200)).await;
    for run in runs.iter_mut().step_by(2) {
        run.cancel(Timestamp::from_millis(T0 as i64 + 100)).unwrap();
        store.update(run).await.unwrap();
    }
    let newest_first: Vec<RunId> = runs.iter().rev().map(|run| run.id).collect();

    let page = store.list(&who, ListRequest { status: None, before: None, limit: 3 }).await.unwrap();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), newest_first[..3]);
    assert!(page.has_more);
    let page = store.list(&who, ListRequest { status: None, before: Some(newest_first[2]), limit: 4 }).await.unwrap();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), newest_first[3..]);
    assert!(!page.has_more, "exactly the last items: no further page");

    let canceled = ListRequest { status: Some(RunStatus::Canceled), before: None, limit: 10 };
    let page = store.list(&who, canceled).await.unwrap();
    let expected: Vec<RunId> = newest_first
        .iter()
        .copied()
        .filter(|id| runs.iter().any(|r| r.id == *id && r.status == RunStatus::Canceled))
        .collect();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), expected);
    assert_eq!(expected.len(), 4);
    let page = store.list(&who, ListRequest { before: Some(expected[1]), limit: 1, ..canceled }).await.unwrap();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![expected[2]]);
    assert!(page.has_more);
}

/// Every page of `request`, with the cursor a client would send, checking
/// that only the last one says no more runs follow.
async fn every_page(store: &dyn TestStore, owner: &Owner, request: ListRequest) -> Vec<Vec<RunId>> {
    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let page = store.list(owner, ListRequest { before, ..request }).await.unwrap();
        let ids: Vec<RunId> = page.runs.iter().map(|run| run.id).collect();
        assert!(ids.len() <= request.limit as usize);
        before = ids.last().copied();
        pages.push(ids);
        if !page.has_more {
            return pages;
        }
        assert!(pages.len() <= 20, "paging does not end: {pages:?}");
    }
}

/// Runs as large as the API allows (a 64 KiB input, echoed as the output):
/// DynamoDB answers a Query with at most 1 MB, about 7 of them, and the
/// store must read on rather than end the list there.
async fn lists_of_large_runs_are_whole(store: &dyn TestStore) {
    let who = owner("bulky");
    let policy = ExecutionPolicy::default();
    let mut newest_first = Vec::new();
    for i in 0..10 {
        let mut run = new_run("bulky", i * 10, 700 + i as u128);
        run.input = format!("{i}").repeat(64 * 1024);
        insert(store, &mut run).await;
        run.claim("w", Timestamp::from_millis(T0 as i64 + 200), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        run.succeed("w", run.input.clone(), Timestamp::from_millis(T0 as i64 + 201)).unwrap();
        store.update(&mut run).await.unwrap();
        newest_first.insert(0, run.id);
    }
    for status in [None, Some(RunStatus::Succeeded)] {
        let whole = ListRequest { status, before: None, limit: 20 };
        assert_eq!(every_page(store, &who, whole).await, vec![newest_first.clone()], "{status:?}");
        let pages = every_page(store, &who, ListRequest { limit: 3, ..whole }).await;
        let expected: Vec<Vec<RunId>> = newest_first.chunks(3).map(<[RunId]>::to_vec).collect();
        assert_eq!(pages, expected, "{status:?}: pages of 3, 3, 3 and 1, in order, none repeated");
    }
}

async fn due_lists_non_terminal_runs_by_due_time_in_pages(store: &dyn TestStore) {
    let mut runs: Vec<Run> = (0..5).map(|i| new_run("sweep", i, 300 + i as u128)).collect();
    for (i, run) in runs.iter_mut().enumerate() {
        run.due_at = Some(Timestamp::from_millis(1_000 + i as i64 * 100));
        insert(store, run).await;
    }
    runs[1].cancel(Timestamp::from_millis(T0 as i64)).unwrap();
    store.update(&mut runs[1]).await.unwrap();

    let all = store.due(Timestamp::from_millis(1_300), None, 10).await.unwrap();
    let ids: Vec<RunId> = all.iter().map(|due| due.key.run_id).collect();
    assert_eq!(ids, vec![runs[0].id, runs[2].id, runs[3].id], "terminal runs leave the index");
    let first: Vec<DueRun> = store.due(Timestamp::MAX, None, 2).await.unwrap();
    let rest = store.due(Timestamp::MAX, first.last(), 10).await.unwrap();
    let paged: Vec<RunId> = first.iter().chain(rest.iter()).map(|due| due.key.run_id).collect();
    assert!(
        paged.starts_with(&[runs[0].id, runs[2].id, runs[3].id, runs[4].id]),
        "{paged:?} {:?}",
        runs.iter().map(|r| r.id).collect::<Vec<_>>()
    );
    assert_eq!(first[0].due_at, Timestamp::from_millis(1_000));
}

async fn keys_are_found_by_hash_listed_and_revoked(keys: &dyn KeyStore) {
    let id = KeyId::from_ulid(Ulid::from_parts(T0, 1));
    let key = StoredKey {
        id,
        owner: owner("acme"),
        name: Some("ci".into()),
        hash: [7; 32],
        created_at: Timestamp::from_millis(T0 as i64),
        revoked_at: None,
        scopes: Scopes::of([Scope::RunsRead, Scope::ApprovalsDecide]),
    };
    keys.put_key(&key).await.unwrap();
    assert_eq!(keys.find_key(&[7; 32]).await.unwrap(), Some(key.clone()));
    assert_eq!(keys.find_key(&[8; 32]).await.unwrap(), None);
    assert!(keys.list_keys().await.unwrap().contains(&key));
    assert!(keys.revoke_key(id, Timestamp::from_millis(T0 as i64 + 1)).await.unwrap());
    let revoked = keys.find_key(&[7; 32]).await.unwrap().unwrap();
    assert_eq!(revoked.revoked_at, Some(Timestamp::from_millis(T0 as i64 + 1)));
    assert!(!keys.revoke_key(KeyId::from_ulid(Ulid::from_parts(T0, 2)), Timestamp::from_millis(0)).await.unwrap());
    let everything =
        StoredKey { id: KeyId::from_ulid(Ulid::from_parts(T0, 3)), hash: [9; 32], scopes: Scopes::all(), ..key };
    keys.put_key(&everything).await.unwrap();
    assert_eq!(keys.find_key(&[9; 32]).await.unwrap().unwrap().scopes, Scopes::all());
    assert_eq!(Scopes::all().to_stored(), None, "every scope is kept as none named: later ones included");
    let from_a_later_build = Scopes::stored(Some(["runs:read", "runs:delete"]));
    assert_eq!(from_a_later_build, Scopes::of([Scope::RunsRead]), "an unknown name grants nothing");
}

async fn concurrent_updates_from_one_version_have_exactly_one_winner(store: Arc<dyn TestStore>) {
    let mut run = new_run("race", 0, 400);
    insert(store.as_ref(), &mut run).await;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let store = store.clone();
        let mut copy = run.clone();
        tasks.push(tokio::spawn(async move {
            copy.claim(&format!("w{worker}"), Timestamp::from_millis(T0 as i64 + 1), &ExecutionPolicy::default())
                .unwrap();
            store.update(&mut copy).await.is_ok()
        }));
    }
    let mut winners = 0;
    for task in tasks {
        winners += task.await.unwrap() as usize;
    }
    assert_eq!(winners, 1);
}

/// Creates at once (on SQLite they share a group commit): the active-run
/// limit and an Idempotency-Key hold exactly, as for creates one by one.
async fn concurrent_inserts_keep_the_limit_and_a_key_exactly(store: Arc<dyn TestStore>) {
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut run = new_run("crowd", i, 90_000 + u128::from(i));
            store.insert(&mut run, None, 7).await.unwrap()
        }));
    }
    let mut inserted = 0;
    for task in tasks {
        match task.await.unwrap() {
            InsertOutcome::Inserted => inserted += 1,
            InsertOutcome::TooManyActiveRuns => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(inserted, 7, "exactly the limit");
    assert_eq!(store.active_runs(&owner("crowd")).await.unwrap(), 7);

    let mut tasks = Vec::new();
    for i in 0..10u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut run = new_run("keyed", i, 91_000 + u128::from(i));
            let outcome = store.insert(&mut run, Some(&claim("same", "request", T0 + i)), 1_000).await.unwrap();
            (run.id, outcome)
        }));
    }
    let (mut created, mut replays) = (Vec::new(), Vec::new());
    for task in tasks {
        match task.await.unwrap() {
            (id, InsertOutcome::Inserted) => created.push(id),
            (_, InsertOutcome::IdempotencyKeyTaken(record)) => replays.push(record.run_id),
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(created.len(), 1, "one run for one key");
    assert!(replays.len() == 9 && replays.iter().all(|id| *id == created[0]), "{replays:?} {created:?}");
    assert_eq!(store.active_runs(&owner("keyed")).await.unwrap(), 1);
}

fn agent(name: &str, model: &str) -> AgentDefinition {
    serde_json::from_value::<AgentDefinition>(serde_json::json!({
        "name": name, "provider": "openai", "model": model, "system_prompt": "Be brief.", "allow_private_network": true,
        "tools": [{"name": "t", "description": "A tool.", "method": "POST", "url": "http://127.0.0.1:9/t",
                   "requires_approval": true, "headers_from_env": {"X-Key": "TOOL_KEY"}}]
    }))
    .unwrap()
    .parse()
    .unwrap()
}

async fn agents_are_put_replaced_listed_and_deleted(agents: &dyn AgentStore) {
    assert_eq!(agents.get_agent("ops").await.unwrap(), None);
    agents.put_agent(&agent("ops", "m1"), Timestamp::from_millis(1)).await.unwrap();
    agents.put_agent(&agent("billing", "m1"), Timestamp::from_millis(2)).await.unwrap();
    agents.put_agent(&agent("ops", "m2"), Timestamp::from_millis(3)).await.unwrap();
    assert_eq!(agents.get_agent("ops").await.unwrap(), Some(agent("ops", "m2")));
    let names: Vec<String> = agents.list_agents().await.unwrap().into_iter().map(|agent| agent.name).collect();
    assert_eq!(names, ["billing", "ops"]);
    assert!(agents.delete_agent("ops").await.unwrap());
    assert!(!agents.delete_agent("ops").await.unwrap());
    assert_eq!(agents.get_agent("ops").await.unwrap(), None);
    assert_eq!(agents.list_agents().await.unwrap().len(), 1);
}

/// A transcript-sized checkpoint (kept apart from the run item on DynamoDB)
/// round-trips through every kind of write, and goes when the run ends.
async fn large_checkpoints_round_trip(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let mut run = new_run("big", 0, 500);
    insert(store, &mut run).await;
    let at = |millis: i64| Timestamp::from_millis(T0 as i64 + millis);
    let big = |fill: &str| serde_json::json!({"transcript": fill.repeat(300_000), "n": 1});
    let mut run = store.get(&owner("big"), run.id).await.unwrap().unwrap();
    run.claim("w", at(1), &policy).unwrap();
    store.update(&mut run).await.unwrap();
    for (step, checkpoint) in [big("a"), serde_json::json!({"small": true}), big("b")].into_iter().enumerate() {
        run.heartbeat("w", Some(checkpoint.clone()), at(2 + step as i64), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        let stored = store.get(&owner("big"), run.id).await.unwrap().unwrap();
        assert_eq!(stored.checkpoint, Some(checkpoint), "step {step}");
        assert_eq!(stored, run);
    }
    // A stale writer still loses, checkpoint or not.
    let mut stale = run.clone();
    stale.version -= 1;
    stale.heartbeat("w", Some(big("c")), at(9), &policy).unwrap();
    assert!(matches!(store.update(&mut stale).await, Err(StoreError::Conflict)));
    assert_eq!(store.get(&owner("big"), run.id).await.unwrap().unwrap().checkpoint, Some(big("b")));
    // Listing shows the run (without reading its checkpoint).
    let page = store.list(&owner("big"), ListRequest { status: None, before: None, limit: 5 }).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.runs[0].id, run.id);
    run.succeed("w", "done".into(), at(10)).unwrap();
    store.update(&mut run).await.unwrap();
    let done = store.get(&owner("big"), run.id).await.unwrap().unwrap();
    assert_eq!((done.status, done.checkpoint), (RunStatus::Succeeded, None));
}

/// Each write stores the events of its change with it, numbered on from
/// the run's count; a write that loses its race stores none; reads page in
/// order; an undone create leaves no events behind.
async fn events_are_written_with_their_change_and_read_in_order(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let at = |millis: i64| Timestamp::from_millis(T0 as i64 + millis);
    let kinds = |page: &EventPage| page.events.iter().map(|event| event.kind.clone()).collect::<Vec<_>>();
    let mut run = new_run("events", 0, 900);
    insert(store, &mut run).await;
    assert_eq!((run.event_seq, run.pending_events.len()), (1, 0), "the insert counted run.created");
    let created = store.events(run.id, 0, 10).await.unwrap();
    assert_eq!(kinds(&created), ["run.created"]);
    let data: serde_json::Value = serde_json::from_str(&created.events[0].data).unwrap();
    assert_eq!((data["id"].as_str(), data["status"].as_str()), (Some(run.id.to_string().as_str()), Some("queued")));
    assert_eq!(created.events[0].at, run.created_at);

    run.claim("w", at(1), &policy).unwrap();
    let mut stale = run.clone();
    store.update(&mut run).await.unwrap();
    // The loser of a race writes nothing, its events included.
    assert!(matches!(store.update(&mut stale).await, Err(StoreError::Conflict)));
    for line in ["one", "two", "three"] {
        run.record(at(2), EventData::output(line));
    }
    run.park(
        "w",
        vec![(ApprovalId::from_ulid(Ulid::from_parts(T0 + 3, 1)), "Ship it".into())],
        serde_json::json!({}),
        at(3),
        &policy,
    )
    .unwrap();
    store.update(&mut run).await.unwrap();
    assert_eq!(run.event_seq, 7);
    assert_eq!(store.get(&owner("events"), run.id).await.unwrap().unwrap().event_seq, 7, "the count is stored");

    let all = store.events(run.id, 0, 100).await.unwrap();
    // One event by its seq, as the page has it; none past the log's end.
    assert_eq!(store.event(run.id, 4).await.unwrap().as_ref(), all.events.get(3));
    assert_eq!(store.event(run.id, 8).await.unwrap(), None);
    assert_eq!(
        kinds(&all),
        [
            "run.created",
            "run.started",
            "output.appended",
            "output.appended",
            "output.appended",
            "approval.requested",
            "run.awaiting_approval"
        ]
    );
    assert_eq!(all.events.iter().map(|event| event.seq).collect::<Vec<_>>(), (1..=7).collect::<Vec<u64>>());
    assert!(!all.has_more);
    let middle = store.events(run.id, 2, 3).await.unwrap();
    assert_eq!(middle.events.iter().map(|event| event.seq).collect::<Vec<_>>(), [3, 4, 5]);
    assert!(middle.has_more);
    let text: serde_json::Value = serde_json::from_str(&middle.events[1].data).unwrap();
    assert_eq!(text, serde_json::json!({"text": "two", "truncated": false}));
    let last = store.events(run.id, 6, 1).await.unwrap();
    assert_eq!((last.events.len(), last.has_more), (1, false));
    assert!(store.events(run.id, 7, 10).await.unwrap().events.is_empty());

    // The events of one run are not another's.
    let mut other = new_run("events", 1, 901);
    insert(store, &mut other).await;
    assert_eq!(store.events(other.id, 0, 10).await.unwrap().events.len(), 1);
    // An undone create takes its run.created with it.
    assert!(store.undo_create(&other, None).await.unwrap());
    assert!(store.events(other.id, 0, 10).await.unwrap().events.is_empty());
}

/// A run of `agent` awaiting `approvals` approvals requested `at` ms after T0.
async fn awaiting(store: &dyn TestStore, owner_name: &str, agent: &str, at: u64, approvals: u128) -> Run {
    let policy = ExecutionPolicy::default();
    let mut run = new_run(owner_name, at, 1);
    run.agent = agent.into();
    insert(store, &mut run).await;
    let when = Timestamp::from_millis((T0 + at) as i64);
    run.claim("w", when, &policy).unwrap();
    let requests = (1..=approvals)
        .map(|n| (ApprovalId::from_ulid(Ulid::from_parts(T0 + at, n)), format!("step {n}").as_str().into()))
        .collect();
    run.park("w", requests, serde_json::json!({}), when, &policy).unwrap();
    store.update(&mut run).await.unwrap();
    run
}

async fn inbox(store: &dyn TestStore, owner_name: &str, status: ApprovalStatus, agent: Option<&str>) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let request = InboxRequest { status, agent: agent.map(str::to_owned), after, limit: 2 };
        let page = store.inbox(&owner(owner_name), request).await.unwrap();
        assert!(page.entries.len() <= 2);
        for entry in &page.entries {
            let run = store.get(&owner(owner_name), entry.run_id).await.unwrap().unwrap();
            assert_eq!((entry.agent.as_str(), entry.run_status), (run.agent.as_str(), run.status));
            assert_eq!(entry.approval.status, status);
            seen.push(format!("{}:{}", run.agent, entry.approval.action));
        }
        if !page.has_more {
            return seen;
        }
        assert_eq!(page.entries.len(), 2, "a page that says more follow is full");
        after = page.entries.last().map(|entry| entry.position());
    }
}

async fn the_inbox_lists_approvals_newest_first_by_status_and_agent(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let mut older = awaiting(store, "inbox", "echo", 10, 2).await;
    let mut newer = awaiting(store, "inbox", "script", 20, 1).await;
    awaiting(store, "inbox-other", "echo", 30, 1).await;
    let pending = ApprovalStatus::Pending;
    assert_eq!(inbox(store, "inbox", pending, None).await, ["script:step 1", "echo:step 2", "echo:step 1"]);
    assert_eq!(inbox(store, "inbox", pending, Some("echo")).await, ["echo:step 2", "echo:step 1"]);
    assert!(inbox(store, "inbox", pending, Some("nobody")).await.is_empty());
    assert_eq!(inbox(store, "inbox-other", pending, None).await, ["echo:step 1"]);

    let first = older.approvals[0].id;
    let approve = DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: None };
    older.decide(first, approve, Timestamp::from_millis((T0 + 40) as i64), &policy).unwrap();
    store.update(&mut older).await.unwrap();
    newer.cancel(Timestamp::from_millis((T0 + 41) as i64)).unwrap();
    store.update(&mut newer).await.unwrap();
    assert_eq!(inbox(store, "inbox", pending, None).await, ["echo:step 2"]);
    assert_eq!(inbox(store, "inbox", ApprovalStatus::Approved, None).await, ["echo:step 1"]);
    assert_eq!(inbox(store, "inbox", ApprovalStatus::Canceled, Some("script")).await, ["script:step 1"]);
    assert!(inbox(store, "inbox", ApprovalStatus::Canceled, Some("echo")).await.is_empty());
    let request = InboxRequest { status: ApprovalStatus::Canceled, agent: None, after: None, limit: 5 };
    let canceled = store.inbox(&owner("inbox"), request).await.unwrap();
    assert_eq!(canceled.entries[0].run_status, RunStatus::Canceled);
    assert!(!canceled.has_more);
}

/// `count` runs of `owner_name` awaiting one approval each, and each with
/// that approval approved in memory (not written).
async fn decided_in_memory(store: &dyn TestStore, owner_name: &str, first_at: u64, count: u64) -> Vec<Run> {
    let mut runs = Vec::new();
    for n in 0..count {
        let mut run = awaiting(store, owner_name, "echo", first_at + n, 1).await;
        let approve =
            DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: None };
        let at = Timestamp::from_millis((T0 + 1_000) as i64);
        run.decide(run.approvals[0].id, approve, at, &ExecutionPolicy::default()).unwrap();
        runs.push(run);
    }
    runs
}

async fn a_batch_of_runs_is_written_whole_or_not_at_all(store: &dyn TestStore) {
    let mut runs = decided_in_memory(store, "batch", 100, 3).await;
    // Another writer changed the second run: none of the three is written.
    let mut other = store.get(&owner("batch"), runs[1].id).await.unwrap().unwrap();
    other
        .extend_approval(
            other.approvals[0].id,
            std::time::Duration::from_secs(60 * 60 * 48),
            Timestamp::from_millis((T0 + 500) as i64),
            &ExecutionPolicy::default(),
        )
        .unwrap();
    store.update(&mut other).await.unwrap();
    let before = runs.clone();
    let failed = store.update_batch(&mut runs).await.unwrap_err();
    assert!(matches!((failed.written, failed.error), (0, StoreError::Conflict)));
    assert_eq!(runs, before, "the caller's runs are as they were");
    let stored = store.get(&owner("batch"), runs[0].id).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::AwaitingApproval);
    assert_eq!(store.events(runs[0].id, 0, 100).await.unwrap().events.len(), 4, "no event of the batch either");

    runs.remove(1);
    store.update_batch(&mut runs).await.unwrap();
    for run in &runs {
        let stored = store.get(&owner("batch"), run.id).await.unwrap().unwrap();
        assert_eq!((stored.status, stored.version, stored.event_seq), (RunStatus::Queued, run.version, 6));
        assert!(run.pending_events.is_empty());
    }
}

async fn run_contract(runs: Arc<dyn TestStore>, keys: &dyn KeyStore, agents: &dyn AgentStore) {
    a_batch_of_runs_is_written_whole_or_not_at_all(runs.as_ref()).await;
    the_inbox_lists_approvals_newest_first_by_status_and_agent(runs.as_ref()).await;
    undo_create_keeps_a_run_that_moved_on(runs.as_ref()).await;
    agents_are_put_replaced_listed_and_deleted(agents).await;
    large_checkpoints_round_trip(runs.as_ref()).await;
    events_are_written_with_their_change_and_read_in_order(runs.as_ref()).await;
    get_returns_what_insert_wrote_and_only_to_its_owner(runs.as_ref()).await;
    update_is_conditional_on_the_version_read(runs.as_ref()).await;
    idempotency_keys_are_reserved_atomically_with_the_run(runs.as_ref()).await;
    insert_refuses_past_the_active_run_limit(runs.as_ref()).await;
    list_is_newest_first_with_keyset_pages_and_a_status_filter(runs.as_ref()).await;
    lists_of_large_runs_are_whole(runs.as_ref()).await;
    due_lists_non_terminal_runs_by_due_time_in_pages(runs.as_ref()).await;
    concurrent_updates_from_one_version_have_exactly_one_winner(runs.clone()).await;
    concurrent_inserts_keep_the_limit_and_a_key_exactly(runs.clone()).await;
    keys_are_found_by_hash_listed_and_revoked(keys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("nested/folder/runs.db"), Durability::Process).unwrap();
    run_contract(Arc::new(store.clone()), &store, &store).await;
}

/// The embedded server's store keeps recent runs in memory: the same
/// contract holds, and a second server on the same file is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_for_serving_keeps_the_contract_and_owns_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open_for_serving(&path, Durability::Process).unwrap();
    run_contract(Arc::new(store.clone()), &store, &store).await;
    let error = SqliteStore::open_for_serving(&path, Durability::Process).err().expect("a second server is refused");
    assert!(agent_runs_shared::error_chain(&error).contains("another `agent-runs serve` is using"));
    // What the cache serves is what a plain reader of the file sees.
    let plain = SqliteStore::open(&path, Durability::Process).unwrap();
    for owner_name in ["acme", "big", "race"] {
        let page =
            plain.list(&owner(owner_name), ListRequest { status: None, before: None, limit: 100 }).await.unwrap();
        for run in page.runs {
            assert_eq!(store.get(&run.owner, run.id).await.unwrap().map(|cached| cached.version), Some(run.version));
        }
    }
    drop(store);
    SqliteStore::open_for_serving(&path, Durability::Process).expect("the lock goes with the server");
}

#[tokio::test]
async fn sqlite_store_survives_reopening_and_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut run = new_run("acme", 0, 1);
    {
        let store = SqliteStore::open(&path, Durability::Full).unwrap();
        insert(&store, &mut run).await;
    }
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    assert_eq!(store.get(&owner("acme"), run.id).await.unwrap(), Some(run));
    awaiting(&store, "acme-inbox", "script", 5, 2).await;
    drop(store);
    // A database from before the inbox (schema 6) has it filled from its runs.
    let connection = rusqlite::Connection::open(&path).unwrap();
    // (Webhooks came after: schema 8.)
    let without_webhooks = "DROP TABLE webhooks; DROP TABLE webhook_outbox; DROP TABLE webhook_attempts;";
    connection.execute_batch(&format!("{without_webhooks} DROP TABLE approvals; PRAGMA user_version = 6;")).unwrap();
    drop(connection);
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    assert_eq!(inbox(&store, "acme-inbox", ApprovalStatus::Pending, None).await, ["script:step 2", "script:step 1"]);
    drop(store);
    let without_active_counts =
        "DROP TABLE approvals; ALTER TABLE api_keys DROP COLUMN scopes; DROP TABLE run_events; DROP INDEX idempotency_by_expiry; DROP TRIGGER runs_active_on_insert;
        DROP TRIGGER runs_active_on_end; DROP TRIGGER runs_active_on_delete; DROP TABLE active_runs;";
    let connection = rusqlite::Connection::open(&path).unwrap();
    // A database from before the active-run counts (schema 2) has them counted
    // (and gains the later steps).
    connection.execute_batch(&format!("{without_webhooks} {without_active_counts} PRAGMA user_version = 2;")).unwrap();
    drop(connection);
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    let mut second = new_run("acme", 1, 2);
    assert!(matches!(store.insert(&mut second, None, 1).await.unwrap(), InsertOutcome::TooManyActiveRuns));
    assert!(matches!(store.insert(&mut second, None, 2).await.unwrap(), InsertOutcome::Inserted));
    drop(store);
    let connection = rusqlite::Connection::open(&path).unwrap();
    // A database from before agent definitions (schema 1) gains them.
    connection
        .execute_batch(&format!(
            "{without_webhooks} {without_active_counts} DROP TABLE agents; PRAGMA user_version = 1;"
        ))
        .unwrap();
    drop(connection);
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    agents_are_put_replaced_listed_and_deleted(&store).await;
    assert!(matches!(
        store.insert(&mut new_run("acme", 2, 3), None, 2).await.unwrap(),
        InsertOutcome::TooManyActiveRuns
    ));
    // A key from before scopes (the column empty) may do everything.
    let old_key = StoredKey {
        id: KeyId::from_ulid(Ulid::from_parts(T0, 77)),
        owner: owner("acme"),
        name: None,
        hash: [77; 32],
        created_at: Timestamp::from_millis(T0 as i64),
        revoked_at: None,
        scopes: Scopes::of([Scope::RunsRead]),
    };
    store.put_key(&old_key).await.unwrap();
    drop(store);
    let connection = rusqlite::Connection::open(&path).unwrap();
    connection.execute("UPDATE api_keys SET scopes = NULL WHERE hash = ?1", [vec![77u8; 32]]).unwrap();
    drop(connection);
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    assert_eq!(store.find_key(&[77; 32]).await.unwrap().unwrap().scopes, Scopes::all());
    drop(store);
    let connection = rusqlite::Connection::open(&path).unwrap();
    connection.pragma_update(None, "user_version", 99).unwrap();
    drop(connection);
    assert!(matches!(SqliteStore::open(&path, Durability::Process), Err(StoreError::Defect(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_store_keeps_the_contract() {
    if emulator::without_emulator("dynamodb_store_keeps_the_contract") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    run_contract(Arc::new(store.clone()), &store, &store).await;

    // A batch over one transaction's 100 items is written in several, of
    // whole runs (3 items each here), in order: one that loses a race
    // leaves those before it written.
    let mut runs = decided_in_memory(&store, "large-batch", 200, 40).await;
    let mut other = store.get(&owner("large-batch"), runs[38].id).await.unwrap().unwrap();
    other.cancel(Timestamp::from_millis((T0 + 500) as i64)).unwrap();
    store.update(&mut other).await.unwrap();
    let failed = store.update_batch(&mut runs).await.unwrap_err();
    assert!(matches!((failed.written, &failed.error), (33, StoreError::Conflict)), "{failed}");
    let status = |run: &Run| {
        let store = store.clone();
        let run_id = run.id;
        async move { store.get(&owner("large-batch"), run_id).await.unwrap().unwrap().status }
    };
    assert_eq!(status(&runs[32]).await, RunStatus::Queued);
    assert_eq!(status(&runs[33]).await, RunStatus::AwaitingApproval);
    let mut rest: Vec<Run> = runs.split_off(33).into_iter().filter(|run| run.id != other.id).collect();
    store.update_batch(&mut rest).await.unwrap();
    assert_eq!(status(&rest[5]).await, RunStatus::Queued);

    // A build that knew no events wrote the run back without its count: the
    // next write with events numbers on from the stored log, no seq reused.
    let policy = ExecutionPolicy::default();
    let mut run = new_run("upgrade", 0, 750);
    insert(&store, &mut run).await;
    run.claim("w", Timestamp::from_millis(T0 as i64 + 1), &policy).unwrap();
    store.update(&mut run).await.unwrap();
    let mut forgetful = run.clone();
    forgetful.event_seq = 0;
    forgetful.heartbeat("w", None, Timestamp::from_millis(T0 as i64 + 2), &policy).unwrap();
    store.update(&mut forgetful).await.unwrap();
    let mut run = store.get(&owner("upgrade"), run.id).await.unwrap().unwrap();
    assert_eq!(run.event_seq, 0);
    let approval = ApprovalId::from_ulid(Ulid::from_parts(T0 + 3, 7));
    run.park("w", vec![(approval, "go".into())], serde_json::json!({}), Timestamp::from_millis(T0 as i64 + 3), &policy)
        .unwrap();
    store.update(&mut run).await.unwrap();
    assert_eq!(run.event_seq, 4);
    let log = store.events(run.id, 0, 10).await.unwrap();
    let seqs: Vec<(u64, &str)> = log.events.iter().map(|event| (event.seq, event.kind.as_str())).collect();
    assert_eq!(seqs, [(1, "run.created"), (2, "run.started"), (3, "approval.requested"), (4, "run.awaiting_approval")]);
    assert_eq!(store.get(&owner("upgrade"), run.id).await.unwrap().unwrap().event_seq, 4);
    // A write that truly lost its race still loses.
    let mut stale = run.clone();
    stale.version -= 1;
    stale.cancel(Timestamp::from_millis(T0 as i64 + 4)).unwrap();
    assert!(matches!(store.update(&mut stale).await, Err(StoreError::Conflict)));

    // The emulator does not enforce the 400 KB item limit: check the layout.
    let mut run = new_run("layout", 0, 600);
    insert(&store, &mut run).await;
    run.claim("w", Timestamp::from_millis(T0 as i64 + 1), &policy).unwrap();
    run.heartbeat("w", Some(serde_json::json!("x".repeat(300_000))), Timestamp::from_millis(T0 as i64 + 2), &policy)
        .unwrap();
    store.update(&mut run).await.unwrap();
    let item = |sk: &str| {
        client
            .get_item()
            .table_name(&table)
            .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(format!("RUN#{}", run.id)))
            .key("sk", aws_sdk_dynamodb::types::AttributeValue::S(sk.into()))
            .send()
    };
    let run_item = item("RUN").await.unwrap().item.unwrap();
    assert!(!run_item.contains_key("checkpoint"));
    let size: usize = run_item.iter().map(|(name, value)| name.len() + format!("{value:?}").len()).sum();
    assert!(size < 4_096, "the run item stays small: {size} bytes");
    let checkpoint_item = item("CKPT").await.unwrap().item.unwrap();
    assert!(checkpoint_item["checkpoint"].as_s().unwrap().len() > 300_000);

    // A limit of 16 is split over 2 items of 8. These runs' ids all name
    // item 0, so the last 8 take item 1; each end gives back to the item its
    // create took, so both items are at 0 again, not one above and one below.
    let mut pairs = Vec::new();
    for random in (0..32).step_by(2) {
        let mut run = new_run("pairs", 1_000, random);
        assert!(matches!(store.insert(&mut run, None, 16).await.unwrap(), InsertOutcome::Inserted));
        pairs.push(run);
    }
    let mut refused = new_run("pairs", 1_000, 99);
    assert!(matches!(store.insert(&mut refused, None, 16).await.unwrap(), InsertOutcome::TooManyActiveRuns));
    for run in &mut pairs {
        run.cancel(Timestamp::from_millis(T0 as i64 + 2_000)).unwrap();
        store.update(run).await.unwrap();
    }
    for item in 0..2 {
        let count = count_item(&client, &table, "pairs", item).await.expect("the item is there until its recount");
        assert!(!count.contains_key("runs"), "item {item} counts no run: {count:?}");
    }
}

/// Item `item` of the owner's active-run count, as stored.
async fn count_item(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    owner: &str,
    item: u32,
) -> Option<std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    client
        .get_item()
        .table_name(table)
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(format!("ACTIVE#{owner}#{item}")))
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("ACTIVE".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

/// A DynamoDB store whose calls of `operation` never arrive (each answered
/// 500, as a dropped connection would be), on the same table.
/// A new table on the emulator, made as template.yaml makes it, and a
/// client of the emulator.
async fn fresh_table() -> (aws_sdk_dynamodb::Client, String) {
    let sdk = emulator::sdk_config().await;
    let table = emulator::create_table(&sdk).await;
    (aws_sdk_dynamodb::Client::new(&sdk), table)
}

async fn undelivered(operation: &'static str, table: &str) -> DynamoStore {
    failing(operation, AwsError::NotDelivered, table).await
}

/// A store on `table` whose every call of `operation` is answered `error`.
async fn failing(operation: &'static str, error: AwsError, table: &str) -> DynamoStore {
    use agent_runs_testkit::faults::{AwsErrorInterceptor, Fault, OnCalls};
    let sdk = emulator::sdk_config().await;
    let plan = OnCalls::from(operation, 1, Fault::FailBefore);
    let config =
        aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(AwsErrorInterceptor::new(plan, error)).build();
    DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), table)
}

/// The active-run count is written apart from the runs, so no two creates
/// or ends conflict on it; a crash between a run's write and its count's
/// leaves a place taken, which the recount gives back, and only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_places_a_crash_left_taken_are_given_back_by_the_recount() {
    if emulator::without_emulator("dynamodb_places_a_crash_left_taken_are_given_back_by_the_recount") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    let crashes = owner("crashes");
    let active = || store.active_runs(&crashes);
    let at = |minutes: u64| Timestamp::from_millis((T0 + minutes * 60_000) as i64);

    // An end whose giving back never arrives: the run ended, its place is taken.
    let mut ended = new_run("crashes", 0, 1);
    insert(&store, &mut ended).await;
    ended.cancel(at(0)).unwrap();
    undelivered("UpdateItem", &table).await.update(&mut ended).await.unwrap();
    assert_eq!(store.get(&owner("crashes"), ended.id).await.unwrap().unwrap().status, RunStatus::Canceled);
    // A create whose run never arrives: its place is taken, no run exists.
    let mut lost = new_run("crashes", 0, 2);
    let failed = undelivered("TransactWriteItems", &table).await.insert(&mut lost, None, 1_000).await;
    assert!(matches!(failed, Err(StoreError::Unavailable(_))), "{failed:?}");
    assert!(store.get(&owner("crashes"), lost.id).await.unwrap().is_none());
    // A run that goes on, and one whose transaction was refused each time
    // it was sent (nothing written): its place went back at once.
    let mut live = new_run("crashes", 0, 3);
    insert(&store, &mut live).await;
    let conflicted = failing("TransactWriteItems", AwsError::TransactionConflict, &table).await;
    let refused = conflicted.insert(&mut new_run("crashes", 0, 4), None, 1_000).await;
    assert!(matches!(refused, Err(StoreError::Refused(_))), "known to have written nothing: {refused:?}");
    assert_eq!(active().await.unwrap(), 3, "the ended run's place, the lost create's and the live run's");

    // Not yet due: nothing is checked.
    assert_eq!(store.settle_counts(at(5), None).await.unwrap().items, 0);
    // Due: the ended run's place goes back; the lost create's stays while
    // its create could still be under way.
    let settled = store.settle_counts(at(11), None).await.unwrap();
    assert_eq!((settled.given_back, settled.unfinished), (1, false), "{settled:?}");
    assert_eq!(active().await.unwrap(), 2);
    let settled = store.settle_counts(at(22), None).await.unwrap();
    assert_eq!(settled.given_back, 1, "the create is over: {settled:?}");
    assert_eq!(active().await.unwrap(), 1, "the live run keeps its place");
    assert_eq!(store.settle_counts(at(33), None).await.unwrap().given_back, 0, "the live run keeps it on every pass");
    assert_eq!(active().await.unwrap(), 1);
    live.cancel(at(34)).unwrap();
    store.update(&mut live).await.unwrap();
    assert_eq!(active().await.unwrap(), 0);
    // Items that count nothing go at their recount.
    store.settle_counts(at(60), None).await.unwrap();
    let items = client
        .scan()
        .table_name(&table)
        .filter_expression("begins_with(pk, :count)")
        .expression_attribute_values(":count", aws_sdk_dynamodb::types::AttributeValue::S("ACTIVE#crashes#".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(items.count, 0, "{:?}", items.items);
}

/// An item of a count the recount cannot read is left due for the next
/// pass; the pass goes on rather than failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_items_the_recount_cannot_read_stay_due_for_the_next_pass() {
    if emulator::without_emulator("dynamodb_items_the_recount_cannot_read_stay_due_for_the_next_pass") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client, table.clone());
    let gives_nothing_back = undelivered("UpdateItem", &table).await;
    for i in 0..3 {
        let mut run = new_run("unreadable", i, 10 + u128::from(i));
        insert(&store, &mut run).await;
        run.cancel(Timestamp::from_millis(T0 as i64 + 5)).unwrap();
        gives_nothing_back.update(&mut run).await.unwrap();
    }
    assert_eq!(store.active_runs(&owner("unreadable")).await.unwrap(), 3, "ended, their places left taken");
    let later = Timestamp::from_millis(T0 as i64 + 11 * 60_000);
    let unreadable = undelivered("BatchGetItem", &table).await;
    let settled = unreadable.settle_counts(later, None).await.unwrap();
    assert_eq!((settled.items, settled.given_back), (0, 0), "{settled:?}");
    assert_eq!(store.active_runs(&owner("unreadable")).await.unwrap(), 3);
    assert_eq!(store.settle_counts(later, None).await.unwrap().given_back, 3, "still due");
    assert_eq!(store.active_runs(&owner("unreadable")).await.unwrap(), 0);
}

/// A create whose place or key lookup fails before its run's transaction is
/// sent is known to have written nothing (no message need go out for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_create_failing_before_its_transaction_is_refused() {
    if emulator::without_emulator("dynamodb_a_create_failing_before_its_transaction_is_refused") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client, table.clone());
    let mut unplaced = new_run("unplaced", 0, 1);
    let failed = failing("UpdateItem", AwsError::ServerError, &table).await.insert(&mut unplaced, None, 1_000).await;
    assert!(matches!(failed, Err(StoreError::Refused(_))), "{failed:?}");
    assert!(store.get(&owner("unplaced"), unplaced.id).await.unwrap().is_none());
    // At the limit, a repeated key is looked up: that read fails.
    let mut first = new_run("unplaced", 1, 2);
    assert!(matches!(store.insert(&mut first, None, 1).await.unwrap(), InsertOutcome::Inserted));
    let mut again = new_run("unplaced", 2, 3);
    let key = claim("key-1", "request", T0 + 2);
    let failed = failing("GetItem", AwsError::ServerError, &table).await.insert(&mut again, Some(&key), 1).await;
    assert!(matches!(failed, Err(StoreError::Refused(_))), "{failed:?}");
    assert!(store.get(&owner("unplaced"), again.id).await.unwrap().is_none());
}

/// A batch of ends whose transaction landed though its answer was lost
/// gives its runs' places back at once, as a single end does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_a_batch_of_ends_with_a_lost_answer_gives_its_places_back() {
    if emulator::without_emulator("dynamodb_a_batch_of_ends_with_a_lost_answer_gives_its_places_back") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client, table.clone());
    let mut runs = vec![new_run("batch-ends", 0, 1), new_run("batch-ends", 0, 2)];
    for run in &mut runs {
        insert(&store, run).await;
        run.cancel(Timestamp::from_millis(T0 as i64 + 5)).unwrap();
    }
    assert_eq!(store.active_runs(&owner("batch-ends")).await.unwrap(), 2);
    let answer_lost = failing("TransactWriteItems", AwsError::ServerError, &table).await;
    assert!(answer_lost.update_batch(&mut runs).await.is_err(), "its answer was lost");
    for run in &runs {
        assert_eq!(store.get(&owner("batch-ends"), run.id).await.unwrap().unwrap().status, RunStatus::Canceled);
    }
    assert_eq!(store.active_runs(&owner("batch-ends")).await.unwrap(), 0, "no place waits for the recount");
}

#[tokio::test]
async fn sqlite_purges_expired_idempotency_records_as_new_ones_come_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    let records = || -> i64 {
        let file = rusqlite::Connection::open(&path).unwrap();
        file.query_row("SELECT COUNT(*) FROM idempotency", [], |row| row.get(0)).unwrap()
    };
    // 40 keys at T0, each for 1 s.
    for i in 0..40u64 {
        let mut run = new_run("purge", i, 600 + u128::from(i));
        let claim = claim(&format!("old{i}"), "r", T0);
        assert!(matches!(store.insert(&mut run, Some(&claim), 1_000).await.unwrap(), InsertOutcome::Inserted));
    }
    assert_eq!(records(), 40);
    // An hour after they expired, each new key takes several old ones away.
    let later = T0 + 3_604_000;
    let mut one = new_run("purge", 2_000, 699);
    assert!(matches!(
        store.insert(&mut one, Some(&claim("early", "r", T0 + 2_000)), 1_000).await.unwrap(),
        InsertOutcome::Inserted
    ));
    assert_eq!(records(), 41, "not purged within the hour after they expired");
    for i in 0..3u64 {
        let mut run = new_run("purge", 3_604_000 + i, 700 + u128::from(i));
        let claim = claim(&format!("new{i}"), "r", later);
        assert!(matches!(store.insert(&mut run, Some(&claim), 1_000).await.unwrap(), InsertOutcome::Inserted));
    }
    assert_eq!(records(), 3, "the expired 41 are gone, the 3 live ones stay");
    // A live record is never purged: its key still replays.
    let mut again = new_run("purge", 3_604_010, 710);
    let outcome = store.insert(&mut again, Some(&claim("new0", "r", later + 10)), 1_000).await.unwrap();
    assert!(matches!(outcome, InsertOutcome::IdempotencyKeyTaken(_)));
}

#[tokio::test]
async fn sqlite_due_pages_go_past_a_malformed_row_without_coming_up_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    let mut runs: Vec<Run> = (0..5u64).map(|i| new_run("due", i, 800 + u128::from(i))).collect();
    for run in &mut runs {
        insert(&store, run).await;
    }
    let file = rusqlite::Connection::open(&path).unwrap();
    file.execute("UPDATE runs SET id = 'garbled' WHERE id = ?1", [runs[1].id.to_string()]).unwrap();
    let page = store.due(Timestamp::MAX, None, 2).await.unwrap();
    let ids: Vec<RunId> = page.iter().map(|due| due.key.run_id).collect();
    assert_eq!(ids, [runs[0].id, runs[2].id], "the malformed row is left out and the page is still full");
    let rest = store.due(Timestamp::MAX, page.last(), 10).await.unwrap();
    assert_eq!(rest.iter().map(|due| due.key.run_id).collect::<Vec<_>>(), [runs[3].id, runs[4].id]);
}

/// The serving store answers a list with the JSON it made once per write:
/// the same as encoding what the list reads, after every write, for runs
/// in its cache and out of it, with any filter and cursor.
#[tokio::test]
async fn sqlite_list_views_are_the_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open_for_serving(&path, Durability::Process).unwrap();
    let mut runs = Vec::new();
    for i in 0..7 {
        let mut run = new_run("views", i, u128::from(i));
        if i == 2 {
            // Too large for the cache: a page mixes cached and decoded runs.
            run.input = "x".repeat(8 * 1024);
        }
        insert(&store, &mut run).await;
        runs.push(run);
    }
    // Each page is what encoding the runs the list reads gives; then again
    // after one run changed (its view made anew), and in a reopened store
    // (nothing cached).
    let expected = |store: SqliteStore, request: ListRequest| async move {
        let page = store.list(&owner("views"), request).await.unwrap();
        let views: Vec<String> = page
            .runs
            .iter()
            .map(|run| serde_json::to_string(&agent_runs_shared::views::RunView::from(run)).unwrap())
            .collect();
        (views, page.runs.last().map(|run| run.id), page.has_more)
    };
    let check = |store: SqliteStore, request: ListRequest| async move {
        let got = store.list_views(&owner("views"), request).await.unwrap();
        let got = (got.views.iter().map(|view| view.to_string()).collect::<Vec<_>>(), got.last, got.has_more);
        assert_eq!(got, expected(store, request).await, "{request:?}");
    };
    let all = ListRequest { status: None, before: None, limit: 100 };
    check(store.clone(), all).await;
    let mut changed = runs[3].clone();
    changed.status = RunStatus::Running;
    changed.started_at = Some(changed.created_at);
    store.update(&mut changed).await.unwrap();
    check(store.clone(), all).await;
    check(store.clone(), ListRequest { status: Some(RunStatus::Running), before: None, limit: 5 }).await;
    check(store.clone(), ListRequest { status: Some(RunStatus::Queued), before: Some(runs[5].id), limit: 2 }).await;
    drop(store);
    let reopened = SqliteStore::open_for_serving(&path, Durability::Process).unwrap();
    check(reopened.clone(), all).await;
    let page =
        reopened.list_views(&owner("views"), ListRequest { status: None, before: None, limit: 3 }).await.unwrap();
    assert_eq!((page.views.len(), page.last, page.has_more), (3, Some(runs[4].id), true));
}

/// Turns the table's items back into the layout from before the shards (runs,
/// checkpoints, idempotency records and one count under `OWNER#<owner>`), as
/// a table written by an earlier version holds them.
async fn to_layout_before_shards(client: &aws_sdk_dynamodb::Client, table: &str, owner: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let text = |item: &std::collections::HashMap<String, AttributeValue>, name: &str| {
        item.get(name).and_then(|value| value.as_s().ok()).cloned().unwrap_or_default()
    };
    let items = client.scan().table_name(table).send().await.unwrap().items.unwrap_or_default();
    let mut active = 0i64;
    for mut item in items {
        let (pk, sk) = (text(&item, "pk"), text(&item, "sk"));
        let old_key = match (pk.split_once('#'), sk.as_str()) {
            (Some(("RUN", run_id)), "RUN") => {
                let (status_key, _shard) =
                    text(&item, "gsi1pk").rsplit_once('#').map(|(a, b)| (a.to_owned(), b.to_owned())).unwrap();
                item.insert("gsi1pk".into(), AttributeValue::S(status_key));
                if let Some((due_key, _owner)) =
                    text(&item, "gsi2sk").rsplit_once('#').map(|(a, b)| (a.to_owned(), b.to_owned()))
                {
                    item.insert("gsi2sk".into(), AttributeValue::S(due_key));
                }
                Some(format!("RUN#{run_id}"))
            }
            (Some(("RUN", run_id)), "CKPT") => Some(format!("CKPT#{run_id}")),
            (Some(("IDEM", rest)), _) => Some(format!("IDEM#{}", rest.rsplit_once('#').unwrap().1)),
            (Some(("ACTIVE", _)), _) => {
                active += item.get("runs").map_or(0, |runs| runs.as_ss().unwrap().len()) as i64;
                None
            }
            (Some(("OWNER", rest)), _) if rest.contains('#') => None,
            _ => continue,
        };
        client
            .delete_item()
            .table_name(table)
            .key("pk", AttributeValue::S(pk))
            .key("sk", AttributeValue::S(sk))
            .send()
            .await
            .unwrap();
        if let Some(old_sk) = old_key {
            item.insert("pk".into(), AttributeValue::S(format!("OWNER#{owner}")));
            item.insert("sk".into(), AttributeValue::S(old_sk));
            client.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
        }
    }
    client
        .put_item()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("OWNER#{owner}")))
        .item("sk", AttributeValue::S("ACTIVE".into()))
        .item("active", AttributeValue::N(active.to_string()))
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_tables_of_the_layout_before_shards_are_moved_whole() {
    if emulator::without_emulator("dynamodb_tables_of_the_layout_before_shards_are_moved_whole") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    let policy = ExecutionPolicy::default();
    // A queued run with an idempotency key, a running one with a checkpoint
    // kept apart, a canceled one.
    let mut queued = new_run("before", 0, 1);
    let outcome = store.insert(&mut queued, Some(&claim("key-1", "request", T0)), 1_000).await.unwrap();
    assert!(matches!(outcome, InsertOutcome::Inserted));
    let mut big = new_run("before", 1, 2);
    insert(&store, &mut big).await;
    big.claim("w", Timestamp::from_millis(T0 as i64 + 5), &policy).unwrap();
    big.heartbeat("w", Some(serde_json::json!("x".repeat(300_000))), Timestamp::from_millis(T0 as i64 + 6), &policy)
        .unwrap();
    store.update(&mut big).await.unwrap();
    let mut ended = new_run("before", 2, 3);
    insert(&store, &mut ended).await;
    ended.cancel(Timestamp::from_millis(T0 as i64 + 7)).unwrap();
    store.update(&mut ended).await.unwrap();
    to_layout_before_shards(&client, &table, "before").await;
    assert!(store.get(&owner("before"), queued.id).await.unwrap().is_none(), "unmoved runs are not found");

    let migrated = store.migrate_layout(1_000).await.unwrap();
    assert_eq!(migrated, Migrated { runs: 3, idempotency_records: 1, counters: 1, skipped: 0 });
    for run in [&queued, &big, &ended] {
        let found = store.get(&owner("before"), run.id).await.unwrap().unwrap();
        assert_eq!((found.status, found.version, found.event_seq), (run.status, run.version, run.event_seq));
        assert_eq!(found.checkpoint, run.checkpoint);
        assert!(found.count_item.is_some(), "a moved run records its item of the count");
    }
    let listed = every_page(&store, &owner("before"), ListRequest { status: None, before: None, limit: 2 }).await;
    assert_eq!(listed, [vec![ended.id, big.id], vec![queued.id]]);
    let running = ListRequest { status: Some(RunStatus::Running), before: None, limit: 10 };
    assert_eq!(every_page(&store, &owner("before"), running).await, [vec![big.id]]);
    assert_eq!(store.active_runs(&owner("before")).await.unwrap(), 2, "counted anew from the runs not ended");
    let mut again = new_run("before", 3, 4);
    match store.insert(&mut again, Some(&claim("key-1", "request", T0 + 10)), 1_000).await.unwrap() {
        InsertOutcome::IdempotencyKeyTaken(record) => assert_eq!(record.run_id, queued.id),
        _ => panic!("the moved key is still taken"),
    }
    assert_eq!(store.events(big.id, 0, 10).await.unwrap().events.len() as u64, big.event_seq, "events stay");
    // The moved runs go on: ending one gives its part of the count back.
    let mut queued = store.get(&owner("before"), queued.id).await.unwrap().unwrap();
    queued.cancel(Timestamp::from_millis(T0 as i64 + 20)).unwrap();
    store.update(&mut queued).await.unwrap();
    assert_eq!(store.active_runs(&owner("before")).await.unwrap(), 1);
    assert_eq!(store.migrate_layout(1_000).await.unwrap(), Migrated::default(), "a second pass finds nothing left");

    // The layout before the count held its runs' ids: a number on each item.
    use aws_sdk_dynamodb::types::AttributeValue;
    let counts = client
        .scan()
        .table_name(&table)
        .filter_expression("begins_with(pk, :count)")
        .expression_attribute_values(":count", AttributeValue::S("ACTIVE#before#".into()))
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    assert!(!counts.is_empty());
    for item in &counts {
        let counted = item.get("runs").map_or(0, |runs| runs.as_ss().unwrap().len());
        client
            .update_item()
            .table_name(&table)
            .key("pk", item["pk"].clone())
            .key("sk", item["sk"].clone())
            .update_expression("SET active = :counted REMOVE runs")
            .expression_attribute_values(":counted", AttributeValue::N(counted.to_string()))
            .send()
            .await
            .unwrap();
    }
    assert_eq!(store.active_runs(&owner("before")).await.unwrap(), 0, "numbers are not counts any more");
    // Until the migration, the recount keeps the numbers: the migration
    // knows by them that the runs are to be counted anew.
    let in_2100 = Timestamp::from_millis(4_102_444_800_000);
    assert_eq!(store.settle_counts(in_2100, None).await.unwrap().items, counts.len());
    let migrated = store.migrate_layout(1_000).await.unwrap();
    assert_eq!(migrated, Migrated { counters: counts.len(), ..Migrated::default() });
    assert_eq!(store.active_runs(&owner("before")).await.unwrap(), 1, "counted anew from the run not ended");
    big = store.get(&owner("before"), big.id).await.unwrap().unwrap();
    big.cancel(Timestamp::from_millis(T0 as i64 + 30)).unwrap();
    store.update(&mut big).await.unwrap();
    assert_eq!(store.active_runs(&owner("before")).await.unwrap(), 0);
    assert_eq!(store.migrate_layout(1_000).await.unwrap(), Migrated::default());
}
