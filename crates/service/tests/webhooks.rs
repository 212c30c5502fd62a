//! The embedded outbox and one attempt at a time, with a clock the test
//! moves: what five days of failures do to an endpoint, what is refused at
//! delivery time without a connection, and that the outbox row is written
//! with the event (and only for endpoints that want it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agent_runs_domain::{
    Clock, DISABLE_AFTER_FAILING_FOR, EndpointHealth, EventFilter, ExecutionPolicy, ManualClock, Owner, Run, RunId,
    Timestamp, WebhookEndpoint, WebhookId, WebhookSecret, WebhookStatus,
};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::store::{DueSkip, EventLog, Outbox, RunStore, WebhookStore};
use agent_runs_service::webhooks::{
    CREATE_SETTLED_AFTER, Delivered, Deliverer, DeliveryPolicy, OutboxQueue, WebhookEngine,
};
use ulid::Ulid;

const T0: i64 = 1_795_303_478_123;

fn owner() -> Owner {
    Owner::parse("acme").unwrap()
}

fn endpoint(url: &str, events: EventFilter, random: u128) -> WebhookEndpoint {
    WebhookEndpoint {
        id: WebhookId::from_ulid(Ulid::from_parts(T0 as u64, random)),
        owner: owner(),
        url: url.to_owned(),
        events,
        description: None,
        status: WebhookStatus::Enabled,
        created_at: Timestamp::from_millis(T0),
        secret: WebhookSecret::generate(),
        previous_secrets: Vec::new(),
        failing_since: None,
    }
}

async fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap();
    (dir, store)
}

/// A new run (its `run.created` event queues deliveries).
async fn insert_run(store: &SqliteStore, random: u128) -> Run {
    let id = RunId::from_ulid(Ulid::from_parts(T0 as u64, random));
    let mut run = Run::new(id, owner(), "echo".into(), "hi".into(), BTreeMap::new(), &ExecutionPolicy::default());
    store.insert(&mut run, None, 100).await.unwrap();
    run
}

#[tokio::test]
async fn deliveries_are_queued_with_the_event_for_the_endpoints_that_want_it() {
    let (_dir, store) = store().await;
    let everything = endpoint("https://example.com/all", EventFilter::All, 1);
    let finished = endpoint("https://example.com/done", EventFilter::parse(vec!["run.succeeded".into()]).unwrap(), 2);
    let other_owner = WebhookEndpoint {
        owner: Owner::parse("other").unwrap(),
        ..endpoint("https://example.com/o", EventFilter::All, 3)
    };
    for endpoint in [&everything, &finished, &other_owner] {
        assert!(store.create_webhook(endpoint, 20).await.unwrap());
    }
    let run = insert_run(&store, 10).await;
    let due = store.due_deliveries(Timestamp::from_millis(i64::MAX / 2), &DueSkip::default(), 100).await.unwrap();
    assert_eq!(due.len(), 1, "{due:#?}");
    assert_eq!((due[0].endpoint.id, due[0].run_id, due[0].event.seq), (everything.id, run.id, 1));
    assert_eq!((due[0].event.kind.as_str(), due[0].attempts), ("run.created", 0));
    // An endpoint at its limit of deliveries in flight is skipped.
    assert!(
        store
            .due_deliveries(
                Timestamp::from_millis(i64::MAX / 2),
                &DueSkip { endpoints: vec![everything.id], owners: vec![] },
                100
            )
            .await
            .unwrap()
            .is_empty()
    );

    // An undone create takes its deliveries with it.
    assert!(store.undo_create(&run, None).await.unwrap());
    assert!(
        store.due_deliveries(Timestamp::from_millis(i64::MAX / 2), &DueSkip::default(), 100).await.unwrap().is_empty()
    );
    // The owner's limit holds.
    for random in 20..38 {
        assert!(store.create_webhook(&endpoint("https://example.com/n", EventFilter::All, random), 20).await.unwrap());
    }
    assert!(!store.create_webhook(&endpoint("https://example.com/21", EventFilter::All, 99), 20).await.unwrap());
}

#[tokio::test]
async fn an_endpoint_that_fails_every_attempt_for_five_days_is_disabled_and_its_deliveries_dropped() {
    let (_dir, store) = store().await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    // Nothing listens on port 1 of this machine: every attempt fails at once.
    let hook = endpoint("http://127.0.0.1:1/hook", EventFilter::All, 1);
    store.create_webhook(&hook, 20).await.unwrap();
    insert_run(&store, 10).await;
    let deliverer = Deliverer::new(DeliveryPolicy::new(true), clock.clone());

    let mut pending = store.due_deliveries(clock.now(), &DueSkip::default(), 10).await.unwrap().remove(0);
    let first = deliverer.attempt(&hook, pending.run_id, &pending.event, 1).await;
    assert_eq!(first.health, EndpointHealth::FailingSince(clock.now()));
    assert_eq!(first.attempt.http_status, None);
    assert_eq!(first.attempt.error.as_deref(), Some("could not connect to the endpoint"));
    let retry_at = first.retry_at.expect("a retry");
    let wait = retry_at.since(clock.now());
    assert!((Duration::from_secs(4)..=Duration::from_secs(6)).contains(&wait), "{wait:?}");
    store.finish_delivery(&pending, &first.attempt, first.health, first.retry_at).await.unwrap();
    assert!(
        store.due_deliveries(clock.now(), &DueSkip::default(), 10).await.unwrap().is_empty(),
        "not due before its retry"
    );

    // Just under five days later the endpoint still gets its attempts...
    clock.advance(DISABLE_AFTER_FAILING_FOR - Duration::from_secs(1));
    pending = store.due_deliveries(clock.now(), &DueSkip::default(), 10).await.unwrap().remove(0);
    assert_eq!(pending.attempts, 1);
    let hook = store.get_webhook(&owner(), hook.id).await.unwrap().unwrap();
    assert_eq!(hook.failing_since, Some(Timestamp::from_millis(T0)));
    let second = deliverer.attempt(&hook, pending.run_id, &pending.event, 2).await;
    assert_eq!(second.health, EndpointHealth::FailingSince(Timestamp::from_millis(T0)));
    store.finish_delivery(&pending, &second.attempt, second.health, second.retry_at).await.unwrap();

    // ...and at five days it is disabled, its waiting deliveries dropped.
    insert_run(&store, 11).await;
    clock.advance(Duration::from_secs(1));
    pending = store.due_deliveries(clock.now(), &DueSkip::default(), 10).await.unwrap().remove(0);
    let third = deliverer.attempt(&hook, pending.run_id, &pending.event, pending.attempts + 1).await;
    assert_eq!((third.health, third.retry_at), (EndpointHealth::Disable, None));
    store.finish_delivery(&pending, &third.attempt, third.health, third.retry_at).await.unwrap();
    let hook = store.get_webhook(&owner(), hook.id).await.unwrap().unwrap();
    assert_eq!(hook.status, WebhookStatus::Disabled);
    assert!(
        store.due_deliveries(Timestamp::from_millis(i64::MAX / 2), &DueSkip::default(), 10).await.unwrap().is_empty()
    );
    insert_run(&store, 12).await;
    assert!(
        store.due_deliveries(Timestamp::from_millis(i64::MAX / 2), &DueSkip::default(), 10).await.unwrap().is_empty(),
        "disabled"
    );
    let attempts = store.deliveries(&owner(), hook.id, None, 10).await.unwrap().items;
    assert_eq!(attempts.iter().map(|attempt| attempt.attempt).collect::<Vec<_>>(), [1, 2, 1]);
}

#[tokio::test]
async fn private_addresses_and_plain_http_are_refused_at_delivery_without_a_connection() {
    let (_dir, store) = store().await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let deliverer = Deliverer::new(DeliveryPolicy::new(false), clock);
    insert_run(&store, 10).await;
    // An endpoint made while private addresses were allowed, or whose
    // address changed since: checked again at every attempt.
    let hook = endpoint("https://example.com/x", EventFilter::All, 1);
    store.create_webhook(&hook, 20).await.unwrap();
    let run = insert_run(&store, 11).await;
    let event = store.events(run.id, 0, 1).await.unwrap().events.remove(0);
    for url in [
        "https://127.0.0.1:1/x",
        "https://10.0.0.1/x",
        "https://172.16.5.4/x",
        "https://192.168.0.1/x",
        "https://169.254.169.254/latest/meta-data/",
        "https://100.64.0.1/x",
        "https://[::1]/x",
        "https://[fe80::1]/x",
        "https://[fd00:ec2::254]/x",
        "https://[::ffff:169.254.169.254]/x",
        "https://[::ffff:0:7f00:1]/x",
        "https://224.0.0.1/x",
        "https://localhost/x",
        "http://example.com/x",
    ] {
        let target = WebhookEndpoint { url: url.to_owned(), ..hook.clone() };
        let result = deliverer.attempt(&target, run.id, &event, 1).await;
        assert_eq!(result.attempt.http_status, None, "{url}");
        let error = result.attempt.error.unwrap();
        assert!(error.contains("non-public") || error.contains("https"), "{url}: {error}");
        assert!(result.attempt.duration_ms < 1_000, "{url}: refused before any connection");
    }
}

/// The embedded server holds a `run.created` as AWS does: not sent while
/// its create may still be undone, unless its run has moved on (its second
/// event wakes it, and it goes before that event); an undone create's
/// delivery goes with it, never attempted.
#[tokio::test]
async fn a_run_created_waits_in_the_outbox_until_its_run_moves_on_and_goes_with_an_undone_create() {
    let (_dir, store) = store().await;
    let store = Arc::new(store);
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    // Nothing listens on port 1 of this machine: an attempt fails at once.
    let hook = endpoint("http://127.0.0.1:1/hook", EventFilter::All, 1);
    store.create_webhook(&hook, 20).await.unwrap();
    let deliverer = Deliverer::new(DeliveryPolicy::new(true), clock.clone());
    let engine = WebhookEngine::new(deliverer, store.clone(), clock.clone());
    let queue = OutboxQueue(store.as_ref());
    let due = || async { store.due_deliveries(clock.now(), &DueSkip::default(), 10).await.unwrap() };
    let attempted = || async {
        let attempts = store.deliveries(&owner(), hook.id, None, 10).await.unwrap().items;
        attempts.into_iter().map(|attempt| attempt.event_type).rev().collect::<Vec<_>>()
    };

    let mut run = insert_run(&store, 10).await;
    let step = engine.deliver(&queue, &due().await[0]).await.unwrap();
    let settles = Timestamp::from_millis(T0).plus(CREATE_SETTLED_AFTER);
    assert!(matches!(step, Delivered::Held(held) if held.settles == settles), "{step:?}");
    clock.advance(Duration::from_secs(5));
    assert!(due().await.is_empty(), "held while its create may still be undone");
    assert!(attempted().await.is_empty());
    // A worker takes the run (so it was queued): its run.created is due
    // with run.started, and is taken first.
    run.claim("w", clock.now(), &ExecutionPolicy::default()).unwrap();
    store.update(&mut run).await.unwrap();
    let now_due = due().await;
    let kinds: Vec<&str> = now_due.iter().map(|delivery| delivery.event.kind.as_str()).collect();
    assert_eq!(kinds, ["run.created", "run.started"]);
    for delivery in &now_due {
        assert!(matches!(engine.deliver(&queue, delivery).await.unwrap(), Delivered::Attempted(_)));
    }
    assert_eq!(attempted().await, ["run.created", "run.started"]);

    // A create undone (its enqueue failed) while its run.created waits.
    let undone = insert_run(&store, 11).await;
    let waiting = due().await.into_iter().find(|delivery| delivery.run_id == undone.id).unwrap();
    assert!(matches!(engine.deliver(&queue, &waiting).await.unwrap(), Delivered::Held(_)));
    assert!(store.undo_create(&undone, None).await.unwrap());
    clock.advance(CREATE_SETTLED_AFTER);
    assert!(due().await.iter().all(|delivery| delivery.run_id != undone.id), "gone with its run");
    assert_eq!(attempted().await.len(), 2, "never attempted");

    // The second event commits between the engine's look and its hold:
    // the hold does not put the row back, so the wake is not lost.
    let mut raced = insert_run(&store, 13).await;
    let looked_at = due().await.into_iter().find(|delivery| delivery.run_id == raced.id).unwrap();
    raced.claim("w", clock.now(), &ExecutionPolicy::default()).unwrap();
    store.update(&mut raced).await.unwrap();
    store.hold_delivery(&looked_at, clock.now().plus(CREATE_SETTLED_AFTER)).await.unwrap();
    let kinds: Vec<String> = due()
        .await
        .into_iter()
        .filter(|delivery| delivery.run_id == raced.id)
        .map(|delivery| delivery.event.kind)
        .collect();
    assert_eq!(kinds, ["run.created", "run.started"], "still due, first");

    // Unclaimed, a create is surely answered after CREATE_SETTLED_AFTER: sent then.
    let late = insert_run(&store, 12).await;
    let waiting = due().await.into_iter().find(|delivery| delivery.run_id == late.id).unwrap();
    assert!(matches!(engine.deliver(&queue, &waiting).await.unwrap(), Delivered::Attempted(_)), "settled by now");
}
