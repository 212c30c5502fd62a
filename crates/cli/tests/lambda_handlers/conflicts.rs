//! What DynamoDB does and moto does not: transaction conflicts, refused single writes, a call without an answer.

use super::*;

/// A transaction DynamoDB cancels for a conflict with another one wrote
/// nothing: the store sends it again, so a create is not refused and a worker
/// does not hand back a run it just finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn transaction_conflicts_are_sent_again() {
    if support::without_emulator("transaction_conflicts_are_sent_again") {
        return;
    }
    let conflicts = FailNext::new();
    let aws = Aws::with_faults(conflicts.clone(), AwsError::TransactionConflict).await;
    conflicts.fail_next(2);
    let (status, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "once"}))).await;
    assert_eq!(status, 201, "{run}");
    let create_calls = aws.calls.take();
    assert_eq!(create_calls.iter().filter(|call| *call == "TransactWriteItems").count(), 3, "{create_calls:?}");
    assert_eq!(aws.listed_ids().await, [id(&run)]);
    assert_eq!(aws.active_runs().await, 1);

    // The worker's write: the run's end, which carries its claim (echo ends
    // at its first step), conflicts once and is sent again.
    conflicts.fail_next(1);
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty(), "the run is not handed back: {failures:?}");
    let worker_calls = aws.calls.take();
    assert_eq!(worker_calls.iter().filter(|call| *call == "TransactWriteItems").count(), 2, "{worker_calls:?}");
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!((done["status"].as_str(), done["output"].as_str()), (Some("succeeded"), Some("once")));
    assert_eq!(aws.active_runs().await, 0, "the run ended once");
}

/// A single write refused because a transaction holds its item (here the
/// write that pins a replayed create's run) is sent again, not answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn single_writes_refused_for_a_transaction_under_way_are_sent_again() {
    if support::without_emulator("single_writes_refused_for_a_transaction_under_way_are_sent_again") {
        return;
    }
    let conflicts = FailNext::new();
    let aws = Aws::with_faults(conflicts.clone(), AwsError::WriteConflict).await;
    let (body, headers) = (Some(json!({"input": "pinned"})), [("idempotency-key", "pin-1")]);
    let (status, run) = aws.invoke_with(Operation::Create, "POST", "/v1/agent/runs", body.clone(), &headers).await;
    assert_eq!(status, 201, "{run}");
    aws.calls.take();
    conflicts.fail_next(2);
    let (status, replayed) = aws.invoke_with(Operation::Create, "POST", "/v1/agent/runs", body, &headers).await;
    assert_eq!((status, id(&replayed)), (201, id(&run)), "{replayed}");
    let calls = aws.calls.take();
    assert_eq!(calls.iter().filter(|call| *call == "PutItem").count(), 3, "refused twice, then written: {calls:?}");
}

/// When conflicts outlast the store's attempts, a create answers 503 (its
/// outcome is known here: nothing was written), never 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn transaction_conflicts_that_persist_answer_503() {
    if support::without_emulator("transaction_conflicts_that_persist_answer_503") {
        return;
    }
    let conflicts = FailNext::new();
    let aws = Aws::with_faults(conflicts.clone(), AwsError::TransactionConflict).await;
    conflicts.fail_next(usize::MAX);
    let (status, body) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "no"}))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("unavailable")), "{body}");
    let calls = aws.calls.take();
    assert_eq!(
        calls,
        [&["GetItem", "UpdateItem"][..], &["TransactWriteItems"; 6], &["UpdateItem"]].concat(),
        "the key, a place, six sends, the place given back, no message"
    );
    conflicts.fail_next(0);
    assert!(aws.listed_ids().await.is_empty());
    assert_eq!(aws.active_runs().await, 0);
}

/// A DynamoDB call that gets no answer ends with the call timeout, as
/// `Unavailable`, instead of holding a worker past its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_call_without_an_answer_ends_at_the_call_timeout() {
    if support::without_emulator("a_call_without_an_answer_ends_at_the_call_timeout") {
        return;
    }
    use agent_runs_platform::aws_sdk::{STORE_ATTEMPT_TIMEOUT, STORE_CALL_TIMEOUT};
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let accepted = tokio::spawn(async move {
        let mut connections = Vec::new();
        loop {
            connections.push(silent.accept().await.unwrap());
        }
    });
    let config = Config::from_lookup(|name| (name == "AGENT_RUNS_TABLE").then(|| "runs".to_owned())).unwrap();
    let sdk = support::aws_sdk_config().await;
    let dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(&endpoint).build();
    let services = AwsServices::new(config, dynamodb, (&sdk).into()).unwrap();
    let started = std::time::Instant::now();
    let result = services
        .store
        .get(&Owner::parse("dev").unwrap(), RunId::from_ulid(IdGenerator::default().ulid_at(SystemClock.now())))
        .await;
    let elapsed = started.elapsed();
    assert!(matches!(result, Err(StoreError::Unavailable(_))), "{result:?}");
    assert!(elapsed >= STORE_ATTEMPT_TIMEOUT, "{elapsed:?}");
    assert!(elapsed < STORE_CALL_TIMEOUT + std::time::Duration::from_secs(1), "{elapsed:?}");
    accepted.abort();
}

/// A webhook endpoint's create whose transaction landed though its answer
/// was lost (a 500 the SDK retries; DynamoDB would answer the retry from
/// its request token, the emulator finds the endpoint there): the retry's
/// failed condition is this very write, so the create answers 201, once,
/// even when that write took the owner's last place (the count refuses the
/// retry too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_webhook_create_whose_answer_was_lost_is_created_once() {
    if support::without_emulator("a_webhook_create_whose_answer_was_lost_is_created_once") {
        return;
    }
    let lost = FailNext::new();
    let aws = Aws::with_faults(lost.clone(), AwsError::ServerError).await;
    for i in 0..19 {
        let body = json!({"url": format!("https://example.com/hooks/{i}"), "events": ["*"]});
        assert_eq!(aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await.0, 201);
    }
    aws.calls.take();
    lost.fail_next(1);
    let body = json!({"url": "https://example.com/hooks", "events": ["*"]});
    let (status, created) = aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        aws.calls.take(),
        ["TransactWriteItems", "TransactWriteItems", "GetItem"],
        "landed, sent again, read back"
    );
    let (_, listed) = aws.invoke(Operation::ListWebhooks, "GET", "/v1/webhooks?limit=100", None).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 20, "{listed}");
    assert_eq!(listed["data"][0]["id"], created["id"]);
}
