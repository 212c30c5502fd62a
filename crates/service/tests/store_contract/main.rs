//! The store contract: what every RunStore and KeyStore adapter must do.
//! Each check is a function over the traits, run against SQLite and against
//! DynamoDB (the AWS API emulator, table created from template.yaml).

#[path = "../support/emulator.rs"]
mod emulator;

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_runs_aws::{DynamoStore, Migrated};
use agent_runs_domain::{
    AgentDefinition, ApprovalId, ApprovalStatus, Decision, DecisionRequest, EventData, ExecutionPolicy, KeyId, Owner,
    Run, RunId, RunStatus, Scope, Scopes, Timestamp,
};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::store::{
    AgentStore, DueRun, EventLog, EventPage, IdempotencyClaim, InboxRequest, InsertOutcome, KeyStore, ListRequest,
    PolicyStore, RunLists, RunStore, StoreError, StoredKey, Upkeep,
};
use agent_runs_testkit::faults::AwsError;
use agent_runs_testkit::stores::TestStore;
use ulid::Ulid;

mod checks;
mod dynamodb;
mod policies;
mod sqlite;

use checks::*;
use dynamodb::*;
use policies::*;

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

async fn run_contract(
    runs: Arc<dyn TestStore>,
    keys: &dyn KeyStore,
    agents: &dyn AgentStore,
    policies: &dyn PolicyStore,
) {
    policies_are_replaced_whole_and_tried_on_what_people_decided(runs.as_ref(), policies).await;
    a_batch_of_runs_is_written_whole_or_not_at_all(runs.as_ref()).await;
    the_inbox_lists_approvals_newest_first_by_status_and_agent(runs.as_ref()).await;
    undo_create_keeps_a_run_that_moved_on(runs.as_ref()).await;
    agents_are_put_replaced_listed_and_deleted(agents).await;
    large_checkpoints_round_trip(runs.as_ref()).await;
    threads_carry_the_ended_state_and_list_newest_first(runs.as_ref()).await;
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
    run_contract(Arc::new(store.clone()), &store, &store, &store).await;
}

/// The embedded server's store keeps recent runs in memory: the same
/// contract holds, and a second server on the same file is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_for_serving_keeps_the_contract_and_owns_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open_for_serving(&path, Durability::Process).unwrap();
    run_contract(Arc::new(store.clone()), &store, &store, &store).await;
    let error = SqliteStore::open_for_serving(&path, Durability::Process).err().expect("a second server is refused");
    assert!(agent_runs_ports::error_chain(&error).contains("another `agent-runs serve` is using"));
    // What the cache serves is what a plain reader of the file sees.
    let plain = SqliteStore::open(&path, Durability::Process).unwrap();
    for owner_name in ["acme", "big", "race"] {
        let page = plain
            .list(&owner(owner_name), ListRequest { status: None, thread: None, before: None, limit: 100 })
            .await
            .unwrap();
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
    // (Events' format column came later, schema 9, then policies, 10, and
    // conversations, 12.)
    let without_webhooks = "DROP INDEX runs_by_thread; ALTER TABLE runs DROP COLUMN thread_id;
        ALTER TABLE runs DROP COLUMN ended_checkpoint; DROP TABLE policies; DROP TABLE decisions; ALTER TABLE run_events DROP COLUMN format;
        DROP TABLE webhooks; DROP TABLE webhook_outbox; DROP TABLE webhook_attempts;";
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
    run_contract(Arc::new(store.clone()), &store, &store, &store).await;

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
    // A key from before owners' keys were listed.
    let old_key = StoredKey {
        id: KeyId::from_ulid(Ulid::from_parts(T0, 5)),
        owner: owner("before"),
        name: Some("old".into()),
        hash: [55; 32],
        created_at: Timestamp::from_millis(T0 as i64),
        revoked_at: None,
        scopes: Scopes::all(),
    };
    store.put_key(&old_key).await.unwrap();
    client
        .update_item()
        .table_name(&table)
        .key("pk", aws_sdk_dynamodb::types::AttributeValue::S(format!("KEY#{}", hex::encode([55u8; 32]))))
        .key("sk", aws_sdk_dynamodb::types::AttributeValue::S("KEY".into()))
        .update_expression("REMOVE gsi1pk, gsi1sk")
        .send()
        .await
        .unwrap();
    assert_eq!(store.owner_keys(&owner("before")).await.unwrap(), []);
    assert!(store.get(&owner("before"), queued.id).await.unwrap().is_none(), "unmoved runs are not found");

    let migrated = store.migrate_layout(1_000).await.unwrap();
    assert_eq!(migrated, Migrated { runs: 3, idempotency_records: 1, counters: 1, skipped: 0, keys: 1 });
    assert_eq!(store.owner_keys(&owner("before")).await.unwrap(), [old_key], "a key from before is listed");
    for run in [&queued, &big, &ended] {
        let found = store.get(&owner("before"), run.id).await.unwrap().unwrap();
        assert_eq!((found.status, found.version, found.event_seq), (run.status, run.version, run.event_seq));
        assert_eq!(found.checkpoint, run.checkpoint);
        assert!(found.store_note.count_item.is_some(), "a moved run records its item of the count");
    }
    let listed =
        every_page(&store, &owner("before"), ListRequest { status: None, thread: None, before: None, limit: 2 }).await;
    assert_eq!(listed, [vec![ended.id, big.id], vec![queued.id]]);
    let running = ListRequest { status: Some(RunStatus::Running), thread: None, before: None, limit: 10 };
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
