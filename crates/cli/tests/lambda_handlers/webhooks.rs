//! Webhooks on AWS: the stream, the delivery queue, the run.created hold, repeated messages, lists of endpoints and attempts.

use super::*;

/// Every record of the table's stream so far, as the Lambda event a
/// stream's event source mapping would send (the emulator's DynamoDB
/// Streams API, spoken as JSON: no SDK crate for one test).
pub(super) async fn stream_event(aws: &Aws) -> aws_lambda_events::event::dynamodb::Event {
    let table = aws.services.store.table().to_owned();
    let described = aws.dynamodb.describe_table().table_name(&table).send().await.unwrap();
    let arn = described.table.unwrap().latest_stream_arn.expect("the table has a stream, as in template.yaml");
    let client = reqwest::Client::new();
    let call = |target: &'static str, body: Value| {
        let request = client
            .post(support::aws_endpoint())
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", format!("DynamoDBStreams_20120810.{target}"))
            .header("authorization", "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0")
            .body(body.to_string());
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let stream = call("DescribeStream", json!({"StreamArn": arn})).await;
    let mut records = Vec::new();
    for shard in stream["StreamDescription"]["Shards"].as_array().unwrap() {
        let iterator = call(
            "GetShardIterator",
            json!({"StreamArn": arn, "ShardId": shard["ShardId"], "ShardIteratorType": "TRIM_HORIZON"}),
        )
        .await;
        let page = call("GetRecords", json!({"ShardIterator": iterator["ShardIterator"], "Limit": 1000})).await;
        for mut record in page["Records"].as_array().unwrap().iter().cloned() {
            record["eventSourceARN"] = arn.clone().into();
            records.push(record);
        }
    }
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// The delivery queue's waiting messages, as the Lambda event SQS would
/// send (receipt handles and receive counts included).
/// A webhook endpoint for `run.created` at the receiver's `path`, which
/// verifies with the endpoint's secret and answers as `settings` say; the
/// endpoint as created.
pub(super) async fn subscribe_to_run_created(
    aws: &Aws,
    receiver: &Arc<support::receiver::Receiver>,
    path: &'static str,
    mut settings: Value,
) -> Value {
    let body = json!({"url": receiver.url(path), "events": ["run.created"]});
    let (status, endpoint) = aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await;
    assert_eq!(status, 201, "{endpoint}");
    settings["secrets"] = json!([endpoint["secret"]]);
    let receiver = receiver.clone();
    tokio::task::spawn_blocking(move || receiver.configure(path, settings)).await.unwrap();
    endpoint
}

pub(super) async fn delivery_event(aws: &Aws, queue_url: &str) -> SqsEvent {
    let received = aws
        .sqs
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    let records: Vec<Value> = received
        .messages
        .unwrap_or_default()
        .iter()
        .map(|message| {
            let attributes: serde_json::Map<String, Value> = message
                .attributes()
                .into_iter()
                .flatten()
                .map(|(name, value)| (name.as_str().to_owned(), Value::from(value.as_str())))
                .collect();
            json!({
                "messageId": message.message_id(),
                "receiptHandle": message.receipt_handle(),
                "body": message.body(),
                "attributes": attributes,
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:deliveries",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}

/// Messages waiting on the delivery queue, delayed or not (not those
/// received).
async fn messages_waiting(aws: &Aws) -> u32 {
    use aws_sdk_sqs::types::QueueAttributeName::{ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed};
    let attributes = aws
        .sqs
        .get_queue_attributes()
        .queue_url(&aws.webhook_queue_url)
        .attribute_names(ApproximateNumberOfMessages)
        .attribute_names(ApproximateNumberOfMessagesDelayed)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default();
    [ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed]
        .iter()
        .map(|name| attributes[name].parse::<u32>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn webhooks_go_from_the_stream_through_the_delivery_queue_and_verify_with_the_standard_library() {
    use agent_runs_lambda::{handle_deliveries, handle_stream};
    use support::receiver::{Receiver, delivered_ids};

    if support::without_emulator("webhooks_go_from_the_stream_through_the_delivery_queue") {
        return;
    }
    let receiver = Arc::new(tokio::task::spawn_blocking(Receiver::start).await.unwrap());
    let blocking = |work: Box<dyn FnOnce(&Receiver) -> Value + Send>| {
        let receiver = receiver.clone();
        async move { tokio::task::spawn_blocking(move || work(&receiver)).await.unwrap() }
    };
    let aws = Aws::with(Arc::new(Healthy), AwsError::Throttling, &[("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true")]).await;
    let queue = aws.services.webhook_queue.clone().expect("aws-setup names the delivery queue");
    let deliveries_url = aws.webhook_queue_url.clone();
    let engine = aws.services.services.webhook_engine(None);

    let url = receiver.url("aws");
    let (status, endpoint) =
        aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(json!({"url": url, "events": ["*"]}))).await;
    assert_eq!(status, 201, "{endpoint}");
    let secret = endpoint["secret"].clone();
    blocking(Box::new(move |receiver| {
        receiver.configure("aws", json!({"secrets": [secret]}));
        Value::Null
    }))
    .await;
    let (_, listed) = aws.invoke(Operation::ListWebhooks, "GET", "/v1/webhooks", None).await;
    assert_eq!(listed["data"][0]["id"], endpoint["id"], "the webhooks function serves every webhook operation");

    let (status, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "hooked"}))).await;
    assert_eq!(status, 201);
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let (_, events) = aws.invoke(Operation::Events, "GET", &format!("/v1/agent/runs/{}/events", id(&run)), None).await;
    let expected: std::collections::BTreeSet<String> =
        events["data"].as_array().unwrap().iter().map(|event| event["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(expected.len(), 3, "created, started, succeeded: {events}");

    // The notifier skips every item but events; one message per event.
    let response = handle_stream(&aws.services.store, &queue, stream_event(&aws).await).await;
    assert!(response.batch_item_failures.is_empty());
    let mut delivered = 0;
    while delivered < expected.len() {
        let event = delivery_event(&aws, &deliveries_url).await;
        assert!(!event.records.is_empty(), "a message per event was queued");
        delivered += event.records.len();
        let response = handle_deliveries(&engine, &aws.services.store, &queue, event).await;
        assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    }
    let received = blocking(Box::new(|receiver| Value::from(receiver.received("aws")))).await;
    let received = received.as_array().unwrap().clone();
    assert_eq!(delivered_ids(&received), expected);
    assert!(received.iter().all(|delivery| delivery["verified_by"] == json!([0])), "{received:#?}");

    // A failing endpoint: the attempt is recorded and the message hidden
    // until the next attempt (5 s), which then gets through.
    let secret = endpoint["secret"].clone();
    blocking(Box::new(move |receiver| {
        receiver.configure("aws", json!({"secrets": [secret], "status": 503}));
        Value::Null
    }))
    .await;
    let (status, canceled) =
        aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "second"}))).await;
    assert_eq!(status, 201, "{canceled}");
    // Taken by a worker, so its run.created is not held (that is the test below).
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let all_records = stream_event(&aws).await;
    let response = handle_stream(&aws.services.store, &queue, all_records).await;
    assert!(response.batch_item_failures.is_empty());
    // The stream is read again from its start: the first run's events are
    // queued a second time (at least once) and delivered again. Each failed
    // attempt's message is done with, and its next attempt queued as a
    // message of its own, due in about 5 s.
    let mut attempted = 0;
    loop {
        let event = delivery_event(&aws, &deliveries_url).await;
        if event.records.is_empty() {
            break;
        }
        attempted += event.records.len();
        let response = handle_deliveries(&engine, &aws.services.store, &queue, event).await;
        assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    }
    assert_eq!(attempted, 6, "three repeats and the second run's three events");
    let webhook_id = endpoint["id"].as_str().unwrap();
    let (_, attempts) = aws
        .invoke(Operation::ListWebhookDeliveries, "GET", &format!("/v1/webhooks/{webhook_id}/deliveries"), None)
        .await;
    assert_eq!(attempts["data"][0]["http_status"], 503, "{attempts}");
    assert_eq!(attempts["data"][0]["attempt"], 1);

    let secret = endpoint["secret"].clone();
    blocking(Box::new(move |receiver| {
        receiver.configure("aws", json!({"secrets": [secret]}));
        Value::Null
    }))
    .await;
    // Due in about 5 s (±20 %), then received as attempt 2.
    assert!(delivery_event(&aws, &deliveries_url).await.records.is_empty(), "not before the next attempt is due");
    tokio::time::sleep(std::time::Duration::from_millis(6_500)).await;
    let mut retried = 0;
    loop {
        let event = delivery_event(&aws, &deliveries_url).await;
        if event.records.is_empty() {
            break;
        }
        for record in &event.records {
            let message: Value = serde_json::from_str(record.body.as_deref().unwrap()).unwrap();
            assert_eq!(message["attempts"], 1, "{message}");
        }
        retried += event.records.len();
        let response = handle_deliveries(&engine, &aws.services.store, &queue, event).await;
        assert!(response.batch_item_failures.is_empty());
    }
    assert_eq!(retried, 6);
    let (_, attempts) = aws
        .invoke(Operation::ListWebhookDeliveries, "GET", &format!("/v1/webhooks/{webhook_id}/deliveries"), None)
        .await;
    assert_eq!(
        (attempts["data"][0]["http_status"].as_u64(), attempts["data"][0]["attempt"].as_u64()),
        (Some(200), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_run_created_is_held_until_its_create_is_answered_and_never_sent_for_an_undone_create() {
    use agent_runs_domain::{Clock, ManualClock, Owner, RunId};
    use agent_runs_lambda::handle_deliveries;
    use agent_runs_ports::store::RunStore;
    use agent_runs_service::webhooks::{CREATE_SETTLED_AFTER, WebhookEngine};
    use support::receiver::Receiver;

    if support::without_emulator("a_run_created_is_held_until_its_create_is_answered") {
        return;
    }
    let receiver = Arc::new(tokio::task::spawn_blocking(Receiver::start).await.unwrap());
    let received = |receiver: Arc<Receiver>| async move {
        tokio::task::spawn_blocking(move || receiver.received("held")).await.unwrap()
    };
    let aws = Aws::with(Arc::new(Healthy), AwsError::Throttling, &[("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true")]).await;
    let queue = aws.services.webhook_queue.clone().unwrap();
    let deliverer = aws.services.services.deliverer();
    let store = Arc::new(aws.services.store.clone());
    // The engine as the deliver function has it, with the clock given.
    let engine_at = |at| WebhookEngine::new(deliverer.clone(), store.clone(), Arc::new(ManualClock::new(at)));
    let endpoint = subscribe_to_run_created(&aws, &receiver, "held", json!({})).await;
    let owner = Owner::parse("dev").unwrap();
    // The notifier's message for a run's run.created, as SQS hands it over.
    let message_for = |run: &Value| -> SqsEvent {
        let body = json!({"owner": "dev", "webhook_id": endpoint["id"], "run_id": run["id"], "seq": 1, "attempts": 0});
        serde_json::from_value(json!({"Records": [{
            "messageId": format!("m-{}", id(run)), "receiptHandle": "r", "body": body.to_string(),
            "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}
        }]}))
        .unwrap()
    };

    // A run no worker has taken yet: its run.created waits, as a delayed message.
    let (_, undone) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "a"}))).await;
    let now = aws.services.services.clock.as_ref();
    let engine = aws.services.services.webhook_engine(None);
    let response = handle_deliveries(&engine, &aws.services.store, &queue, message_for(&undone)).await;
    assert!(response.batch_item_failures.is_empty());
    assert!(received(receiver.clone()).await.is_empty(), "not sent while its create may still be undone");
    assert_eq!(messages_waiting(&aws).await, 1, "held as a delayed message");
    // Its queue send failed: the create is undone. The held message comes
    // back (in about 2 s, to look again); once the create is surely
    // answered it finds no event to send.
    let run_id: RunId = id(&undone).parse().unwrap();
    let run = aws.services.store.get(&owner, run_id).await.unwrap().unwrap();
    assert!(aws.services.store.undo_create(&run, None).await.unwrap());
    let mut held = delivery_event(&aws, &aws.webhook_queue_url).await;
    for _ in 0..5 {
        if !held.records.is_empty() {
            break;
        }
        held = delivery_event(&aws, &aws.webhook_queue_url).await;
    }
    assert_eq!(held.records.len(), 1, "the held message came back");
    let body: Value = serde_json::from_str(held.records[0].body.as_deref().unwrap()).unwrap();
    assert_eq!(
        (body["run_id"].as_str(), body["seq"].as_u64(), body["attempts"].as_u64()),
        (Some(id(&undone)), Some(1), Some(0))
    );
    assert!(!body["not_before"].is_null(), "{body}");
    let later = ManualClock::new(run.created_at.plus(CREATE_SETTLED_AFTER + std::time::Duration::from_secs(1)));
    let response = handle_deliveries(&engine_at(later.now()), &aws.services.store, &queue, held).await;
    assert!(response.batch_item_failures.is_empty());
    assert!(received(receiver.clone()).await.is_empty(), "never sent for an undone create");
    assert_eq!(messages_waiting(&aws).await, 0, "and not held again");

    // A run that stays: sent once its create is surely answered...
    let (_, kept) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "b"}))).await;
    let created = aws.services.store.get(&owner, id(&kept).parse().unwrap()).await.unwrap().unwrap().created_at;
    let later = ManualClock::new(created.plus(CREATE_SETTLED_AFTER + std::time::Duration::from_secs(1)));
    let response = handle_deliveries(&engine_at(later.now()), &aws.services.store, &queue, message_for(&kept)).await;
    assert!(response.batch_item_failures.is_empty());
    let got = received(receiver.clone()).await;
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(got[0]["body"].as_str().unwrap().contains(id(&kept)), "{got:#?}");
    // ...or at once when a worker has taken its run (so it was queued).
    let (_, taken) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "c"}))).await;
    aws.deliver().await;
    assert!(now.now() < later.now());
    let response = handle_deliveries(&engine, &aws.services.store, &queue, message_for(&taken)).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(received(receiver.clone()).await.len(), 2);
    assert_eq!(messages_waiting(&aws).await, 0, "neither was held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn two_messages_for_the_same_attempt_send_twice_under_one_id_and_queue_one_next_attempt() {
    use agent_runs_lambda::handle_deliveries;
    use support::receiver::Receiver;

    if support::without_emulator("two_messages_for_the_same_attempt") {
        return;
    }
    let receiver = Arc::new(tokio::task::spawn_blocking(Receiver::start).await.unwrap());
    let aws = Aws::with(Arc::new(Healthy), AwsError::Throttling, &[("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true")]).await;
    let queue = aws.services.webhook_queue.clone().unwrap();
    let engine = aws.services.services.webhook_engine(None);
    let endpoint = subscribe_to_run_created(&aws, &receiver, "twice", json!({"status": 503})).await;
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "a"}))).await;
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty(), "a worker took the run: its run.created is not held");
    // The same attempt twice (the notifier sent a record again, or a send
    // whose answer was lost landed), in one batch.
    let message = json!({"owner": "dev", "webhook_id": endpoint["id"], "run_id": run["id"], "seq": 1, "attempts": 0});
    let record = |id: &str| {
        json!({"messageId": id, "receiptHandle": "r", "body": message.to_string(),
               "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}})
    };
    let event: SqsEvent = serde_json::from_value(json!({"Records": [record("m-1"), record("m-2")]})).unwrap();
    let response = handle_deliveries(&engine, &aws.services.store, &queue, event).await;
    assert!(response.batch_item_failures.is_empty());
    let got = {
        let receiver = receiver.clone();
        tokio::task::spawn_blocking(move || receiver.received("twice")).await.unwrap()
    };
    assert_eq!(got.len(), 2, "both made their attempt: {got:#?}");
    assert_eq!(
        got[0]["headers"]["webhook-id"], got[1]["headers"]["webhook-id"],
        "under one id, for the receiver to drop"
    );
    // One next attempt queued between them (claimed once), due in about 5 s.
    assert_eq!(messages_waiting(&aws).await, 1, "one series of retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn webhook_lists_page_through_every_endpoint_and_attempt_on_dynamodb() {
    use agent_runs_domain::{DeliveryAttempt, DeliveryId, EndpointHealth, Timestamp, WebhookId};
    use agent_runs_ports::store::WebhookStore;

    if support::without_emulator("webhook_lists_page_through_every_endpoint_and_attempt_on_dynamodb") {
        return;
    }
    let aws = Aws::new().await;
    let mut created = Vec::new();
    for i in 0..7 {
        let body = json!({"url": format!("https://example.com/hook/{i}"), "events": ["run.failed"]});
        let (status, endpoint) = aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await;
        assert_eq!(status, 201, "{endpoint}");
        created.push(endpoint["id"].as_str().unwrap().to_owned());
    }
    let mut listed = Vec::new();
    let mut path = "/v1/webhooks?limit=3".to_owned();
    loop {
        let (status, page) = aws.invoke(Operation::ListWebhooks, "GET", &path, None).await;
        assert_eq!(status, 200, "{page}");
        listed.extend(
            page["data"].as_array().unwrap().iter().map(|endpoint| endpoint["id"].as_str().unwrap().to_owned()),
        );
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/webhooks?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    created.reverse();
    assert_eq!(listed, created, "every endpoint once, newest first");

    let webhook_id: WebhookId = created[0].parse().unwrap();
    let owner = Owner::parse("dev").unwrap();
    let ids = IdGenerator::default();
    for attempt in 1..=45 {
        let at = SystemClock.now();
        let record = DeliveryAttempt {
            id: DeliveryId::from_ulid(ids.ulid_at(at)),
            webhook_id,
            event_id: "evt_01JDQ3V7Q4K8Z2X9M5N6P7R8S9".into(),
            event_type: "run.failed".into(),
            attempt,
            http_status: Some(500),
            error: Some("the endpoint answered HTTP 500".into()),
            duration_ms: 3,
            at,
        };
        aws.services
            .store
            .record_attempt(&owner, &record, EndpointHealth::FailingSince(Timestamp::from_millis(0)))
            .await
            .unwrap();
    }
    let mut attempts = Vec::new();
    let mut path = format!("/v1/webhooks/{webhook_id}/deliveries");
    loop {
        let (status, page) = aws.invoke(Operation::ListWebhookDeliveries, "GET", &path, None).await;
        assert_eq!(status, 200, "{page}");
        attempts.extend(page["data"].as_array().unwrap().iter().map(|attempt| attempt["attempt"].as_u64().unwrap()));
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/webhooks/{webhook_id}/deliveries?cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(attempts, (1..=45).rev().collect::<Vec<u64>>(), "every attempt once, newest first");
    let (_, endpoint) = aws.invoke(Operation::GetWebhook, "GET", &format!("/v1/webhooks/{webhook_id}"), None).await;
    assert_eq!(endpoint["status"], "enabled");

    // Rotation, deletion and the limit of 20, on the table.
    let rotate = format!("/v1/webhooks/{}/rotate-secret", created[1]);
    let (status, rotated) = aws.invoke(Operation::RotateWebhookSecret, "POST", &rotate, None).await;
    assert_eq!(status, 200, "{rotated}");
    let (status, again) = aws.invoke(Operation::RotateWebhookSecret, "POST", &rotate, None).await;
    assert_eq!(status, 200);
    assert!(rotated["secret"].as_str().unwrap().starts_with("whsec_") && rotated["secret"] != again["secret"]);
    let stored = aws.services.store.get_webhook(&owner, created[1].parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(stored.secret.expose(), again["secret"].as_str().unwrap());
    assert_eq!(stored.previous_secrets.len(), 2, "both replaced secrets still sign");
    let gone = format!("/v1/webhooks/{}", created[2]);
    let (status, deleted) = aws.invoke(Operation::DeleteWebhook, "DELETE", &gone, None).await;
    assert_eq!((status, deleted), (200, json!({"id": created[2], "deleted": true})));
    assert_eq!(aws.invoke(Operation::GetWebhook, "GET", &gone, None).await.0, 404);
    assert_eq!(aws.invoke(Operation::DeleteWebhook, "DELETE", &gone, None).await.0, 404);
    for i in 0..14 {
        let body = json!({"url": format!("https://example.com/more/{i}"), "events": ["*"]});
        assert_eq!(aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await.0, 201);
    }
    let body = json!({"url": "https://example.com/21st", "events": ["*"]});
    let (status, refused) = aws.invoke(Operation::CreateWebhook, "POST", "/v1/webhooks", Some(body)).await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("20"), "{refused}");
}
