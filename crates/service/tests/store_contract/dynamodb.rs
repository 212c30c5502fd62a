//! What only the DynamoDB store does: the active-run count's items and recount, refused creates, the move from the layout before shards.

use super::*;

/// Item `item` of the owner's active-run count, as stored.
pub(super) async fn count_item(
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
pub(super) async fn fresh_table() -> (aws_sdk_dynamodb::Client, String) {
    let sdk = emulator::sdk_config().await;
    let table = emulator::create_table(&sdk).await;
    (aws_sdk_dynamodb::Client::new(&sdk), table)
}

pub(super) async fn undelivered(operation: &'static str, table: &str) -> DynamoStore {
    failing(operation, AwsError::NotDelivered, table).await
}

/// A store on `table` whose every call of `operation` is answered `error`.
pub(super) async fn failing(operation: &'static str, error: AwsError, table: &str) -> DynamoStore {
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
pub(super) async fn dynamodb_places_a_crash_left_taken_are_given_back_by_the_recount() {
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
pub(super) async fn dynamodb_items_the_recount_cannot_read_stay_due_for_the_next_pass() {
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
pub(super) async fn dynamodb_a_create_failing_before_its_transaction_is_refused() {
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
pub(super) async fn dynamodb_a_batch_of_ends_with_a_lost_answer_gives_its_places_back() {
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
pub(super) async fn dynamodb_events_from_before_the_record_read_as_written() {
    if emulator::without_emulator("dynamodb_events_from_before_the_record_read_as_written") {
        return;
    }
    use aws_sdk_dynamodb::types::AttributeValue::{N, S};
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    let mut run = new_run("legacy", 0, 802);
    insert(&store, &mut run).await;
    // An item as events were written before the record: no `fmt`.
    client
        .put_item()
        .table_name(&table)
        .item("pk", S(format!("RUN#{}", run.id)))
        .item("sk", S(format!("EV#{:012}", 2)))
        .item("seq", N("2".into()))
        .item("type", S("output.appended".into()))
        .item("at", N(T0.to_string()))
        .item("data", S(LEGACY_EVENT.into()))
        .item("owner", S("legacy".into()))
        .send()
        .await
        .unwrap();
    events_from_before_the_record_read_as_written(&store, &run).await;
    // A deploy over an earlier release writes events as that release did:
    // the JSON clients get, rendered at write, which both releases serve.
    use agent_runs_ports::store::{EventFormat, RENDERED_FORMAT};
    use agent_runs_ports::views::ExtraFields;
    let store = store.writing_events(EventFormat::Rendered).showing(ExtraFields { trace_ids: true });
    let mut run = new_run("legacy", 1, 803);
    insert(&store, &mut run).await;
    let created = store.event(run.id, 1).await.unwrap().unwrap();
    assert_eq!(created.data.format(), RENDERED_FORMAT);
    let json: serde_json::Value = serde_json::from_str(created.data.text()).unwrap();
    assert_eq!(
        (json["id"].as_str(), json["trace_id"].as_str()),
        (Some(&*run.id.to_string()), Some(&*run.trace().trace_id_hex()))
    );
    assert_eq!(created.data_json(ExtraFields::default()).unwrap(), created.data.text());
}

/// With a kind filter, DynamoDB reads each entry's run: a page reads a
/// bounded number of entries and, when it stops short, says where, so the
/// next page goes on from there; nothing is skipped or repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn dynamodb_a_kind_filtered_inbox_stops_short_and_goes_on() {
    use agent_runs_domain::{ApprovalKind, ApprovalRequest};
    if emulator::without_emulator("dynamodb_a_kind_filtered_inbox_stops_short_and_goes_on") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client, table).reading_inbox_kinds(2);
    let policy = ExecutionPolicy::default();
    // The oldest run asks a question; five newer ones wait on actions.
    for n in 0..6u64 {
        let mut run = new_run("kinds", 10 + n, 1);
        insert(&store, &mut run).await;
        let when = Timestamp::from_millis((T0 + 10 + n) as i64);
        run.claim("w", when, &policy).unwrap();
        let id = ApprovalId::from_ulid(Ulid::from_parts(T0 + 10 + n, 1));
        let request = if n == 0 {
            ApprovalRequest::question("which?", serde_json::json!({"type": "string"}))
        } else {
            ApprovalRequest::action(format!("step {n}"))
        };
        run.park("w", vec![(id, request)], serde_json::json!({}), when, &policy).unwrap();
        store.update(&mut run).await.unwrap();
    }
    let (mut found, mut pages, mut after) = (Vec::new(), 0, None);
    loop {
        let request = InboxRequest {
            status: ApprovalStatus::Pending,
            agent: None,
            kind: Some(ApprovalKind::Input),
            after,
            limit: 5,
        };
        let page = store.inbox(&owner("kinds"), request).await.unwrap();
        pages += 1;
        found.extend(page.entries.iter().map(|entry| entry.approval.action.clone()));
        if !page.has_more {
            break;
        }
        after = page.resume_after.or_else(|| page.entries.last().map(|entry| entry.position()));
        assert!(pages < 10, "the pages go on");
    }
    assert_eq!(found, ["which?"]);
    assert!(pages >= 3, "two entries a page over six: {pages} pages");
    let all = InboxRequest {
        status: ApprovalStatus::Pending,
        agent: None,
        kind: Some(ApprovalKind::Action),
        after: None,
        limit: 3,
    };
    let actions = store.inbox(&owner("kinds"), all).await.unwrap();
    assert_eq!(actions.entries.len(), 2, "stopped after two entries");
    assert!(actions.has_more && actions.resume_after.is_some());
}

/// A run whose end would keep a state larger than an item holds still
/// ends: the state is not kept (a running run's write of one is refused).
#[tokio::test]
pub(super) async fn dynamodb_an_end_is_never_refused_for_the_state_it_ended_with() {
    if emulator::without_emulator("dynamodb_an_end_is_never_refused_for_the_state_it_ended_with") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    let policy = ExecutionPolicy::default();
    let at = |millis: i64| Timestamp::from_millis(T0 as i64 + millis);
    let key = |run_id: RunId, sk: &str| {
        use aws_sdk_dynamodb::types::AttributeValue::S;
        [("pk".to_owned(), S(format!("RUN#{run_id}"))), ("sk".to_owned(), S(sk.to_owned()))].into()
    };
    let checkpoint_item = |run_id: RunId| {
        client.get_item().table_name(&table).set_key(Some(key(run_id, "CKPT"))).consistent_read(true).send()
    };
    for (random, written_before_the_note) in [(80_001, false), (80_002, true)] {
        let mut run = new_run("huge", 0, random);
        insert(&store, &mut run).await;
        run.claim("w", at(1), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        // A checkpoint kept apart, then one small enough to keep inline: the
        // item apart stays, out of date, until the end.
        let large = serde_json::json!("l".repeat(agent_runs_aws::INLINE_CHECKPOINT_BYTES));
        run.heartbeat("w", Some(large), at(2), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        run.heartbeat("w", Some(serde_json::json!("small")), at(2), &policy).unwrap();
        store.update(&mut run).await.unwrap();
        assert!(checkpoint_item(run.id).await.unwrap().item.is_some());
        if written_before_the_note {
            // As a release that kept no note wrote it (or a writer of that
            // release during a deployment).
            let update = client.update_item().table_name(&table).set_key(Some(key(run.id, "RUN")));
            update.update_expression("REMOVE checkpoint_item").send().await.unwrap();
        }
        let mut run = store.get_to_continue(&owner("huge"), run.id).await.unwrap().unwrap();
        assert_eq!(run.checkpoint, Some(serde_json::json!("small")));
        let too_large = serde_json::json!({"messages": "m".repeat(agent_runs_ports::store::MAX_CHECKPOINT_BYTES)});
        let mut refused = run.clone();
        refused.heartbeat("w", Some(too_large.clone()), at(2), &policy).unwrap();
        assert!(matches!(store.update(&mut refused).await, Err(StoreError::Defect(_))));
        run.succeed("w", "done".into(), Some(too_large), at(3)).unwrap();
        store.update(&mut run).await.unwrap();
        let ended = store.get_to_continue(&owner("huge"), run.id).await.unwrap().unwrap();
        assert_eq!((ended.status, ended.checkpoint), (RunStatus::Succeeded, None));
        // The run noted its item apart (stored with the run, read back), or
        // has no note and may have one: its end, which keeps no state,
        // deleted it.
        let left = checkpoint_item(run.id).await.unwrap().item;
        assert!(left.is_none(), "the out-of-date checkpoint item is gone ({written_before_the_note})");
    }
}
