//! The contract, check by check: each a function over the ports, run on every store.

use super::*;

pub(super) async fn insert(store: &dyn TestStore, run: &mut Run) {
    assert!(matches!(store.insert(run, None, 1_000).await.unwrap(), InsertOutcome::Inserted));
}

pub(super) async fn get_returns_what_insert_wrote_and_only_to_its_owner(store: &dyn TestStore) {
    let mut run = new_run("acme", 0, 1);
    run.metadata.insert("ticket".into(), "OPS-42".into());
    insert(store, &mut run).await;
    assert_eq!(store.get(&owner("acme"), run.id).await.unwrap(), Some(run.clone()));
    assert_eq!(store.get(&owner("other"), run.id).await.unwrap(), None);
    let missing = RunId::from_ulid(Ulid::from_parts(T0, 999));
    assert_eq!(store.get(&owner("acme"), missing).await.unwrap(), None);
}

pub(super) async fn update_is_conditional_on_the_version_read(store: &dyn TestStore) {
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

pub(super) async fn idempotency_keys_are_reserved_atomically_with_the_run(store: &dyn TestStore) {
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

pub(super) async fn insert_refuses_past_the_active_run_limit(store: &dyn TestStore) {
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
pub(super) async fn undo_create_keeps_a_run_that_moved_on(store: &dyn TestStore) {
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
    claimed.succeed("w", "done".into(), None, Timestamp::from_millis(T0 as i64 + 2)).unwrap();
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

pub(super) async fn list_is_newest_first_with_keyset_pages_and_a_status_filter(store: &dyn TestStore) {
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

    let page = store.list(&who, ListRequest { status: None, thread: None, before: None, limit: 3 }).await.unwrap();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), newest_first[..3]);
    assert!(page.has_more);
    let page = store
        .list(&who, ListRequest { status: None, thread: None, before: Some(newest_first[2]), limit: 4 })
        .await
        .unwrap();
    assert_eq!(page.runs.iter().map(|r| r.id).collect::<Vec<_>>(), newest_first[3..]);
    assert!(!page.has_more, "exactly the last items: no further page");

    let canceled = ListRequest { status: Some(RunStatus::Canceled), thread: None, before: None, limit: 10 };
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
pub(super) async fn every_page(store: &dyn TestStore, owner: &Owner, request: ListRequest) -> Vec<Vec<RunId>> {
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
pub(super) async fn lists_of_large_runs_are_whole(store: &dyn TestStore) {
    let who = owner("bulky");
    let policy = ExecutionPolicy::default();
    let mut newest_first = Vec::new();
    for i in 0..10 {
        let mut run = new_run("bulky", i * 10, 700 + i as u128);
        run.input = format!("{i}").repeat(64 * 1024);
        insert(store, &mut run).await;
        run.claim("w", Timestamp::from_millis(T0 as i64 + 200), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        run.succeed("w", run.input.clone(), None, Timestamp::from_millis(T0 as i64 + 201)).unwrap();
        store.update(&mut run).await.unwrap();
        newest_first.insert(0, run.id);
    }
    for status in [None, Some(RunStatus::Succeeded)] {
        let whole = ListRequest { status, thread: None, before: None, limit: 20 };
        assert_eq!(every_page(store, &who, whole).await, vec![newest_first.clone()], "{status:?}");
        let pages = every_page(store, &who, ListRequest { limit: 3, ..whole }).await;
        let expected: Vec<Vec<RunId>> = newest_first.chunks(3).map(<[RunId]>::to_vec).collect();
        assert_eq!(pages, expected, "{status:?}: pages of 3, 3, 3 and 1, in order, none repeated");
    }
}

pub(super) async fn due_lists_non_terminal_runs_by_due_time_in_pages(store: &dyn TestStore) {
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

pub(super) async fn keys_are_found_by_hash_listed_and_revoked(keys: &dyn KeyStore) {
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
    let elsewhere = StoredKey {
        id: KeyId::from_ulid(Ulid::from_parts(T0, 4)),
        owner: owner("elsewhere"),
        hash: [10; 32],
        ..everything.clone()
    };
    keys.put_key(&elsewhere).await.unwrap();
    let acme: Vec<_> = keys.owner_keys(&owner("acme")).await.unwrap();
    assert_eq!(acme, [revoked, everything], "the owner's keys, oldest first, revoked ones too");
    assert_eq!(keys.owner_keys(&owner("elsewhere")).await.unwrap(), [elsewhere]);
    assert_eq!(keys.owner_keys(&owner("nobody")).await.unwrap(), []);
    let from_a_later_build = Scopes::stored(Some(["runs:read", "runs:delete"]));
    assert_eq!(from_a_later_build, Scopes::of([Scope::RunsRead]), "an unknown name grants nothing");
}

pub(super) async fn concurrent_updates_from_one_version_have_exactly_one_winner(store: Arc<dyn TestStore>) {
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
pub(super) async fn concurrent_inserts_keep_the_limit_and_a_key_exactly(store: Arc<dyn TestStore>) {
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

pub(super) fn agent(name: &str, model: &str) -> AgentDefinition {
    serde_json::from_value::<AgentDefinition>(serde_json::json!({
        "name": name, "provider": "openai", "model": model, "system_prompt": "Be brief.", "allow_private_network": true,
        "tools": [{"name": "t", "description": "A tool.", "method": "POST", "url": "http://127.0.0.1:9/t",
                   "requires_approval": true, "headers_from_env": {"X-Key": "TOOL_KEY"}}]
    }))
    .unwrap()
    .parse()
    .unwrap()
}

pub(super) async fn agents_are_put_replaced_listed_and_deleted(agents: &dyn AgentStore) {
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
/// round-trips through every kind of write, and is kept when the run ends
/// for a run continuing it alone (gets of the ended run leave it out).
pub(super) async fn large_checkpoints_round_trip(store: &dyn TestStore) {
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
    let page =
        store.list(&owner("big"), ListRequest { status: None, thread: None, before: None, limit: 5 }).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.runs[0].id, run.id);
    run.succeed("w", "done".into(), None, at(10)).unwrap();
    store.update(&mut run).await.unwrap();
    let done = store.get(&owner("big"), run.id).await.unwrap().unwrap();
    assert_eq!((done.status, done.checkpoint), (RunStatus::Succeeded, None));
    let ended = store.get_to_continue(&owner("big"), run.id).await.unwrap().unwrap();
    assert_eq!((ended.status, ended.checkpoint), (RunStatus::Succeeded, Some(big("b"))));
    assert_eq!(store.get_to_continue(&owner("other"), run.id).await.unwrap(), None);
}

/// A continuation carries the state the run it continues ended with (a
/// large one too), its thread is listed newest first with the first run
/// last, in pages, with a status filter, to its owner alone; an undone
/// continuation leaves nothing in its thread.
pub(super) async fn threads_carry_the_ended_state_and_list_newest_first(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let at = |millis: i64| Timestamp::from_millis(T0 as i64 + millis);
    let who = owner("talk");
    let transcript = serde_json::json!({"messages": "m".repeat(40_000)});
    let mut root = new_run("talk", 0, 70_001);
    insert(store, &mut root).await;
    root.claim("w", at(1), &policy).unwrap();
    root.heartbeat("w", Some(serde_json::json!({"messages": "so far"})), at(2), &policy).unwrap();
    root.succeed("w", "done".into(), Some(transcript.clone()), at(3)).unwrap();
    store.update(&mut root).await.unwrap();
    let ended = store.get_to_continue(&who, root.id).await.unwrap().unwrap();
    assert_eq!(ended.checkpoint.as_ref(), Some(&transcript));

    let mut unrelated = new_run("talk", 5, 70_009);
    insert(store, &mut unrelated).await;
    let mut first = new_run("talk", 10, 70_002).continuing(&ended);
    insert(store, &mut first).await;
    let stored = store.get(&who, first.id).await.unwrap().unwrap();
    assert_eq!(stored, first);
    assert_eq!((stored.carried_checkpoint(), stored.own_checkpoint()), (Some(&transcript), None));
    assert_eq!((stored.thread_id(), stored.previous_run_id()), (root.id, Some(root.id)));
    let mut fork = new_run("talk", 20, 70_003).continuing(&ended);
    insert(store, &mut fork).await;
    fork.claim("w", at(21), &policy).unwrap();
    fork.fail("w", "no".into(), at(22)).unwrap();
    store.update(&mut fork).await.unwrap();
    first.cancel(at(23)).unwrap();
    store.update(&mut first).await.unwrap();
    let first_ended = store.get_to_continue(&who, first.id).await.unwrap().unwrap();
    assert_eq!(first_ended.checkpoint.as_ref(), Some(&transcript), "canceled before a step: what it carried");
    let mut third = new_run("talk", 30, 70_004).continuing(&first_ended);
    insert(store, &mut third).await;
    assert_eq!((third.thread_id(), third.previous_run_id()), (root.id, Some(first.id)));

    let thread = |status, limit| ListRequest { status, thread: Some(root.id), before: None, limit };
    let whole = [third.id, fork.id, first.id, root.id];
    for limit in [1, 2, 3, 4, 10] {
        let pages = every_page(store, &who, thread(None, limit)).await;
        assert_eq!(pages.concat(), whole, "pages of {limit}");
    }
    let canceled = every_page(store, &who, thread(Some(RunStatus::Canceled), 1)).await;
    assert_eq!(canceled.concat(), [first.id]);
    let ended_ok = every_page(store, &who, thread(Some(RunStatus::Succeeded), 2)).await;
    assert_eq!(ended_ok.concat(), [root.id], "the first run, found by its id, filtered too");
    assert!(store.list(&owner("other"), thread(None, 10)).await.unwrap().runs.is_empty(), "another owner's");
    // A run in the middle of a thread names no thread of its own.
    let middle = ListRequest { thread: Some(first.id), ..thread(None, 10) };
    assert!(store.list(&who, middle).await.unwrap().runs.is_empty());
    let views = store.list_views(&who, thread(None, 10)).await.unwrap();
    assert_eq!(views.views.len(), 4);
    assert!(views.views[0].contains(&format!(r#""thread_id":"{}","previous_run_id":"{}""#, root.id, first.id)));
    assert!(views.views[3].contains(&format!(r#""thread_id":"{}","previous_run_id":null"#, root.id)));

    // A continuation whose create is undone leaves its thread as it was.
    let mut undone = new_run("talk", 40, 70_005).continuing(&ended);
    insert(store, &mut undone).await;
    assert!(store.undo_create(&undone, None).await.unwrap());
    assert_eq!(store.get(&who, undone.id).await.unwrap(), None);
    assert_eq!(every_page(store, &who, thread(None, 10)).await.concat(), whole);
}

/// Each write stores the events of its change with it, numbered on from
/// the run's count; a write that loses its race stores none; reads page in
/// order; an undone create leaves no events behind.
pub(super) async fn events_are_written_with_their_change_and_read_in_order(store: &dyn TestStore) {
    let policy = ExecutionPolicy::default();
    let at = |millis: i64| Timestamp::from_millis(T0 as i64 + millis);
    let kinds = |page: &EventPage| page.events.iter().map(|event| event.kind.clone()).collect::<Vec<_>>();
    let mut run = new_run("events", 0, 900);
    insert(store, &mut run).await;
    assert_eq!((run.event_seq, run.pending_events.len()), (1, 0), "the insert counted run.created");
    let created = store.events(run.id, 0, 10).await.unwrap();
    assert_eq!(kinds(&created), ["run.created"]);
    let data: serde_json::Value =
        serde_json::from_str(&created.events[0].data_json(Default::default()).unwrap()).unwrap();
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
    let text: serde_json::Value =
        serde_json::from_str(&middle.events[1].data_json(Default::default()).unwrap()).unwrap();
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
pub(super) async fn awaiting(store: &dyn TestStore, owner_name: &str, agent: &str, at: u64, approvals: u128) -> Run {
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

pub(super) async fn inbox(
    store: &dyn TestStore,
    owner_name: &str,
    status: ApprovalStatus,
    agent: Option<&str>,
) -> Vec<String> {
    inbox_of_kind(store, owner_name, status, agent, None).await
}

pub(super) async fn inbox_of_kind(
    store: &dyn TestStore,
    owner_name: &str,
    status: ApprovalStatus,
    agent: Option<&str>,
    kind: Option<agent_runs_domain::ApprovalKind>,
) -> Vec<String> {
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let request = InboxRequest { status, agent: agent.map(str::to_owned), kind, after, limit: 2 };
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

pub(super) async fn the_inbox_lists_approvals_newest_first_by_status_and_agent(store: &dyn TestStore) {
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
    let request = InboxRequest { status: ApprovalStatus::Canceled, agent: None, kind: None, after: None, limit: 5 };
    let canceled = store.inbox(&owner("inbox"), request).await.unwrap();
    assert_eq!(canceled.entries[0].run_status, RunStatus::Canceled);
    assert!(!canceled.has_more);

    // One park may ask questions and approvals at once; the kind filter
    // picks among them, page by page.
    use agent_runs_domain::{ApprovalKind, ApprovalRequest};
    let mut mixed = new_run("inbox-kinds", 50, 1);
    mixed.agent = "ops".into();
    insert(store, &mut mixed).await;
    let when = Timestamp::from_millis((T0 + 50) as i64);
    mixed.claim("w", when, &policy).unwrap();
    let id = |n: u128| ApprovalId::from_ulid(Ulid::from_parts(T0 + 50, n));
    let requests = vec![
        (id(1), "step 1".into()),
        (id(2), ApprovalRequest::question("which?", serde_json::json!({"type": "string"}))),
        (id(3), "step 3".into()),
        (id(4), ApprovalRequest::question("when?", serde_json::json!({"type": "string"}))),
        (id(5), "step 5".into()),
    ];
    mixed.park("w", requests, serde_json::json!({}), when, &policy).unwrap();
    store.update(&mut mixed).await.unwrap();
    let of_kind = |kind| inbox_of_kind(store, "inbox-kinds", pending, None, Some(kind));
    assert_eq!(of_kind(ApprovalKind::Input).await, ["ops:when?", "ops:which?"]);
    assert_eq!(of_kind(ApprovalKind::Action).await, ["ops:step 5", "ops:step 3", "ops:step 1"]);
    assert!(of_kind(ApprovalKind::ToolCall).await.is_empty());
    let answer = DecisionRequest {
        decision: Decision::Answer(serde_json::json!("now")),
        comment: None,
        seen_sha256: None,
        decided_by: None,
    };
    mixed.decide(id(4), answer, Timestamp::from_millis((T0 + 51) as i64), &policy).unwrap();
    store.update(&mut mixed).await.unwrap();
    assert_eq!(of_kind(ApprovalKind::Input).await, ["ops:which?"]);
    let answered = inbox_of_kind(store, "inbox-kinds", ApprovalStatus::Answered, None, Some(ApprovalKind::Input)).await;
    assert_eq!(answered, ["ops:when?"]);
    let stored = store.get(&owner("inbox-kinds"), mixed.id).await.unwrap().unwrap();
    assert_eq!(stored.approvals[3].answer, Some(serde_json::json!("now")), "the answer is stored");
    assert_eq!(stored.approvals[3].input_schema, Some(serde_json::json!({"type": "string"})));
}

/// `count` runs of `owner_name` awaiting one approval each, and each with
/// that approval approved in memory (not written).
pub(super) async fn decided_in_memory(store: &dyn TestStore, owner_name: &str, first_at: u64, count: u64) -> Vec<Run> {
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

pub(super) async fn a_batch_of_runs_is_written_whole_or_not_at_all(store: &dyn TestStore) {
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

/// What an event written before events were stored as records holds: its
/// JSON as clients got it.
pub(super) const LEGACY_EVENT: &str = r#"{"text":"from before","truncated":false}"#;

/// After `run`'s `run.created`, the store holds [`LEGACY_EVENT`] as event 2:
/// both read back, the new one rendered now, the old one as it was written.
pub(super) async fn events_from_before_the_record_read_as_written(store: &dyn TestStore, run: &Run) {
    use agent_runs_ports::store::{EventBody, RENDERED_FORMAT};
    use agent_runs_ports::views::ExtraFields;
    let page = store.events(run.id, 0, 10).await.unwrap();
    assert_eq!(
        page.events.iter().map(|event| event.kind.as_str()).collect::<Vec<_>>(),
        ["run.created", "output.appended"]
    );
    let created = page.events[0].data.decode("run.created").unwrap();
    assert!(matches!(created, Some(EventData::RunCreated(created)) if created.id == run.id));
    assert_eq!(page.events[1].data, EventBody::stored(RENDERED_FORMAT, LEGACY_EVENT.into()));
    let shown = ExtraFields { trace_ids: true };
    let created: serde_json::Value = serde_json::from_str(&page.events[0].data_json(shown).unwrap()).unwrap();
    assert_eq!(created["trace_id"], run.trace().trace_id_hex(), "rendered as this deployment shows runs");
    assert_eq!(store.event(run.id, 2).await.unwrap().unwrap().data_json(shown).unwrap(), LEGACY_EVENT);
}
