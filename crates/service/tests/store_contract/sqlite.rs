//! What only the SQLite store does: purging, paging past bad rows, list views.

use super::*;

#[tokio::test]
pub(super) async fn sqlite_purges_expired_idempotency_records_as_new_ones_come_in() {
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
pub(super) async fn sqlite_due_pages_go_past_a_malformed_row_without_coming_up_short() {
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
pub(super) async fn sqlite_list_views_are_the_runs_as_written() {
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
            .map(|run| serde_json::to_string(&agent_runs_ports::views::RunView::new(run, Default::default())).unwrap())
            .collect();
        (views, page.runs.last().map(|run| run.id), page.has_more)
    };
    let check = |store: SqliteStore, request: ListRequest| async move {
        let got = store.list_views(&owner("views"), request).await.unwrap();
        let got = (got.views.iter().map(|view| view.to_string()).collect::<Vec<_>>(), got.last, got.has_more);
        assert_eq!(got, expected(store, request).await, "{request:?}");
    };
    let all = ListRequest { status: None, thread: None, before: None, limit: 100 };
    check(store.clone(), all).await;
    let mut changed = runs[3].clone();
    changed.status = RunStatus::Running;
    changed.started_at = Some(changed.created_at);
    store.update(&mut changed).await.unwrap();
    check(store.clone(), all).await;
    check(store.clone(), ListRequest { status: Some(RunStatus::Running), thread: None, before: None, limit: 5 }).await;
    check(
        store.clone(),
        ListRequest { status: Some(RunStatus::Queued), thread: None, before: Some(runs[5].id), limit: 2 },
    )
    .await;
    drop(store);
    let reopened = SqliteStore::open_for_serving(&path, Durability::Process).unwrap();
    check(reopened.clone(), all).await;
    let page = reopened
        .list_views(&owner("views"), ListRequest { status: None, thread: None, before: None, limit: 3 })
        .await
        .unwrap();
    assert_eq!((page.views.len(), page.last, page.has_more), (3, Some(runs[4].id), true));
}

#[tokio::test]
pub(super) async fn sqlite_events_from_before_the_record_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path, Durability::Process).unwrap();
    let mut run = new_run("legacy", 0, 801);
    insert(&store, &mut run).await;
    // A row as schema 8 wrote it: no format (the migration's default).
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO run_events (run_id, seq, type, created_at, data) VALUES (?1, 2, 'output.appended', ?2, ?3)",
            rusqlite::params![run.id.to_string(), T0 as i64, LEGACY_EVENT],
        )
        .unwrap();
    events_from_before_the_record_read_as_written(&store, &run).await;
}

/// A get answers with the serving store's JSON of the run: the JSON of the
/// very write last answered, while gets run beside a stream of writes, and
/// never going back for any reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn sqlite_views_follow_every_write_under_concurrent_gets() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_for_serving(dir.path().join("runs.db"), Durability::Process).unwrap();
    let mut run = new_run("follow", 0, 7);
    insert(&store, &mut run).await;
    let tokens = |view: &str| -> u64 {
        let json: serde_json::Value = serde_json::from_str(view).unwrap();
        json["usage"]["total_tokens"].as_u64().unwrap_or(0)
    };
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, writing, run_id) = (store.clone(), writing.clone(), run.id);
            tokio::spawn(async move {
                let (mut seen, mut reads) = (0, 0);
                // At least one read each, however late its task starts.
                loop {
                    let view = store.run_json(&owner("follow"), run_id).await.unwrap().expect("the run is there");
                    let now = tokens(&view);
                    assert!(now >= seen, "a get went back from {seen} tokens to {now}");
                    (seen, reads) = (now, reads + 1);
                    tokio::task::yield_now().await;
                    if !writing.load(std::sync::atomic::Ordering::Relaxed) {
                        break reads;
                    }
                }
            })
        })
        .collect();
    for total in 1..=300 {
        run.usage = Some(agent_runs_domain::Usage { total_tokens: total, ..Default::default() });
        store.update(&mut run).await.unwrap();
        let view = store.run_json(&owner("follow"), run.id).await.unwrap().unwrap();
        let written = serde_json::to_string(&agent_runs_ports::views::RunView::new(&run, Default::default())).unwrap();
        assert_eq!(*view, written, "the view of write {total}");
    }
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    assert_eq!(store.run_json(&owner("other"), run.id).await.unwrap(), None, "another owner's run is not found");
}

/// The serving store answers a list with a page it kept only while none of
/// the owner's runs changed since: lists of the same pages beside a stream
/// of creates, status changes and undone creates always show the last
/// answered write, never go back, and never show another owner's runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn sqlite_list_pages_follow_every_write_under_concurrent_lists() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_for_serving(dir.path().join("runs.db"), Durability::Process).unwrap();
    let all = ListRequest { status: None, thread: None, before: None, limit: 5 };
    let canceled = ListRequest { status: Some(RunStatus::Canceled), ..all };
    let encoded =
        |run: &Run| serde_json::to_string(&agent_runs_ports::views::RunView::new(run, Default::default())).unwrap();
    let first = |page: &agent_runs_ports::store::ViewPage| page.views.first().map(|view| view.to_string());
    let writing = Arc::new(AtomicBool::new(true));
    // The newest run whose create, and whose cancel, was answered: every
    // page read after that starts with it or a newer run.
    let answered = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, writing, answered) = (store.clone(), writing.clone(), answered.clone());
            tokio::spawn(async move {
                let mut reads = 0;
                // At least one read each, however late its task starts.
                loop {
                    for (answered, request) in answered.iter().zip([all, canceled]) {
                        let floor = answered.load(Ordering::SeqCst);
                        let page = store.list_views(&owner("pages"), request).await.unwrap();
                        let newest = page.views.first().map(|view| {
                            let json: serde_json::Value = serde_json::from_str(view).unwrap();
                            json["id"].as_str().unwrap().parse::<RunId>().unwrap()
                        });
                        if floor > 0 {
                            let floor = new_run("pages", floor, 1).id;
                            assert!(newest >= Some(floor), "{request:?}: {newest:?} is older than {floor}");
                        }
                        reads += 1;
                    }
                    tokio::task::yield_now().await;
                    if !writing.load(Ordering::Relaxed) {
                        break reads;
                    }
                }
            })
        })
        .collect();
    let mut theirs = new_run("others", 0, 1);
    insert(&store, &mut theirs).await;
    for i in 1..=150u64 {
        let mut run = new_run("pages", i * 10, 1);
        insert(&store, &mut run).await;
        answered[0].store(i * 10, Ordering::SeqCst);
        let page = store.list_views(&owner("pages"), all).await.unwrap();
        assert_eq!(first(&page), Some(encoded(&run)), "the list after create {i}");
        run.cancel(Timestamp::from_millis((T0 + i * 10 + 1) as i64)).unwrap();
        store.update(&mut run).await.unwrap();
        answered[1].store(i * 10, Ordering::SeqCst);
        for request in [all, canceled] {
            let page = store.list_views(&owner("pages"), request).await.unwrap();
            assert_eq!(first(&page), Some(encoded(&run)), "{request:?} after the cancel of {i}");
        }
        if i % 10 == 0 {
            // A create undone: listed, then gone.
            let mut undone = new_run("pages", i * 10 + 5, 2);
            insert(&store, &mut undone).await;
            assert_eq!(first(&store.list_views(&owner("pages"), all).await.unwrap()), Some(encoded(&undone)));
            assert!(store.undo_create(&undone, None).await.unwrap());
            let page = store.list_views(&owner("pages"), all).await.unwrap();
            assert_eq!(first(&page), Some(encoded(&run)), "the list after the undone create {i}");
            // Another owner's write leaves this owner's pages as they are.
            theirs.input = format!("theirs {i}");
            store.update(&mut theirs).await.unwrap();
            let page = store.list_views(&owner("others"), all).await.unwrap();
            assert_eq!(page.views.iter().map(|view| view.to_string()).collect::<Vec<_>>(), [encoded(&theirs)]);
        }
    }
    writing.store(false, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    let page = store.list_views(&owner("pages"), ListRequest { limit: 100, ..all }).await.unwrap();
    assert_eq!(page.views.len(), 100);
    assert!(page.views.iter().all(|view| !view.contains("theirs")), "no other owner's run in a page");
}

/// The serving store answers the inbox with a page it kept only while none
/// of the owner's runs changed since: inbox pages read beside a stream of
/// parks and approvals always show the last answered write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn sqlite_inbox_pages_follow_every_write_under_concurrent_reads() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_for_serving(dir.path().join("runs.db"), Durability::Process).unwrap();
    let request = |status| InboxRequest { status, agent: None, kind: None, after: None, limit: 5 };
    let run_ids = |page: agent_runs_ports::store::InboxViewPage| {
        page.views
            .iter()
            .map(|view| {
                let json: serde_json::Value = serde_json::from_str(view).unwrap();
                json["run_id"].as_str().unwrap().parse::<RunId>().unwrap()
            })
            .collect::<Vec<_>>()
    };
    let writing = Arc::new(AtomicBool::new(true));
    // The newest run whose approval was answered: every run up to it is
    // approved, so no page read after shows one of them pending.
    let approved = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (store, writing, approved) = (store.clone(), writing.clone(), approved.clone());
            tokio::spawn(async move {
                let mut reads = 0;
                // At least one read each, however late its task starts.
                loop {
                    let floor = approved.load(Ordering::SeqCst);
                    let pending = run_ids(
                        store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Pending)).await.unwrap(),
                    );
                    let newest_approved = run_ids(
                        store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Approved)).await.unwrap(),
                    );
                    if floor > 0 {
                        let floor = new_run("inbox-pages", floor, 1).id;
                        assert!(pending.iter().all(|run_id| *run_id > floor), "{pending:?} holds an approved run");
                        assert!(newest_approved.first() >= Some(&floor), "{newest_approved:?} misses {floor}");
                    }
                    reads += 1;
                    tokio::task::yield_now().await;
                    if !writing.load(Ordering::Relaxed) {
                        break reads;
                    }
                }
            })
        })
        .collect();
    let policy = ExecutionPolicy::default();
    let approve = DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: None };
    for i in 1..=100u64 {
        let mut run = awaiting(&store, "inbox-pages", "echo", i * 10, 1).await;
        let pending =
            run_ids(store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Pending)).await.unwrap());
        assert_eq!(pending.first(), Some(&run.id), "the inbox after park {i}");
        run.decide(run.approvals[0].id, approve.clone(), Timestamp::from_millis((T0 + i * 10 + 1) as i64), &policy)
            .unwrap();
        store.update(&mut run).await.unwrap();
        approved.store(i * 10, Ordering::SeqCst);
        let newest_approved =
            run_ids(store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Approved)).await.unwrap());
        assert_eq!(newest_approved.first(), Some(&run.id), "the approved inbox after approval {i}");
        // A kept page is the page a read from SQLite makes.
        for status in [ApprovalStatus::Pending, ApprovalStatus::Approved] {
            let kept = store.inbox_views(&owner("inbox-pages"), request(status)).await.unwrap();
            let read = agent_runs_ports::store::inbox_views_of(
                store.inbox(&owner("inbox-pages"), request(status)).await.unwrap(),
            )
            .unwrap();
            assert_eq!((kept.views, kept.last, kept.has_more), (read.views, read.last, read.has_more));
        }
        // With no write between two reads, the second answers the page the
        // first kept (or found): the same entries, not encoded again.
        let first = store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Approved)).await.unwrap();
        let second = store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Approved)).await.unwrap();
        assert!(Arc::ptr_eq(&first.views[0], &second.views[0]), "the second read is answered as kept");
        if i % 10 == 0 {
            // Another owner's park leaves this owner's pages as they are,
            // and shows in their own.
            let theirs = awaiting(&store, "inbox-others", "echo", i * 10 + 5, 1).await;
            let their_pending =
                run_ids(store.inbox_views(&owner("inbox-others"), request(ApprovalStatus::Pending)).await.unwrap());
            assert_eq!(their_pending.first(), Some(&theirs.id));
        }
    }
    writing.store(false, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    let pending = run_ids(store.inbox_views(&owner("inbox-pages"), request(ApprovalStatus::Pending)).await.unwrap());
    assert!(pending.is_empty(), "no other owner's approval in a page: {pending:?}");
}
