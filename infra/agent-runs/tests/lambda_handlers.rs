//! The Lambda handlers fed API Gateway v2 and SQS event fixtures, on
//! DynamoDB and SQS in the AWS API emulator: the end-to-end path create →
//! SQS → worker → get, approvals and cancels, and the budget of AWS calls
//! each operation makes, counted by an SDK interceptor.

#[path = "../../../shared/tests/support/stand_in.rs"]
mod stand_in;
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_runs_shared::api::{Api, Operation};
use agent_runs_shared::auth::generate_key;
use agent_runs_shared::aws::AwsServices;
use agent_runs_shared::config::Config;
use agent_runs_shared::domain::AgentDefinition;
use agent_runs_shared::domain::{Clock, IdGenerator, KeyId, Owner, RunId, SystemClock};
use agent_runs_shared::lambda::{from_api_response, handle_batch, handle_dead_letters, into_api_request};
use agent_runs_shared::store::{AgentStore, KeyStore, RunStore, StoreError};
use agent_runs_shared::worker::Worker;
use agent_runs_testkit::faults::{AwsError, AwsErrorInterceptor, FailNext, FaultPlan, Healthy, RandomFailures};
use aws_lambda_events::event::sqs::SqsEvent;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::{Value, json};
use support::events::sqs_event;
use tokio::sync::watch;

/// Records the name of every AWS operation the clients send.
#[derive(Debug, Clone, Default)]
struct CallLog(Arc<Mutex<Vec<String>>>);

impl Intercept for CallLog {
    fn name(&self) -> &'static str {
        "CallLog"
    }

    /// Both services speak AWS JSON: the operation is in `X-Amz-Target`
    /// (`DynamoDB_20120810.GetItem`, `AmazonSQS.SendMessage`). Retries would
    /// show up as repeats.
    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let target = context.request().headers().get("x-amz-target").unwrap_or_default();
        let operation = target.rsplit('.').next().unwrap_or_default();
        self.0.lock().unwrap().push(operation.to_owned());
        Ok(())
    }
}

impl CallLog {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct Aws {
    services: AwsServices,
    api: Api,
    worker: Worker,
    calls: CallLog,
    /// A client of the table without the interceptors, to look at items.
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    webhook_queue_url: String,
    key: String,
}

impl Aws {
    async fn new() -> Aws {
        Self::with_faults(Arc::new(Healthy), AwsError::Throttling).await
    }

    /// DynamoDB calls picked by `plan` are answered with `error`.
    async fn with_faults(plan: Arc<dyn FaultPlan>, error: AwsError) -> Aws {
        Self::with(plan, error, &[]).await
    }

    /// With more configuration.
    async fn with(plan: Arc<dyn FaultPlan>, error: AwsError, settings: &[(&str, &str)]) -> Aws {
        let mut resources: HashMap<String, String> = support::create_aws_resources().into_iter().collect();
        resources.extend(settings.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        let config = Config::from_lookup(|name| resources.get(name).cloned()).unwrap();
        let sdk = support::aws_sdk_config().await;
        let calls = CallLog::default();
        let dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(calls.clone())
            .interceptor(AwsErrorInterceptor::new(plan, error))
            .build();
        let sqs_config = aws_sdk_sqs::config::Builder::from(&sdk).interceptor(calls.clone()).build();
        let services = AwsServices::new(config, dynamodb, sqs_config).unwrap();
        let now = SystemClock.now();
        let issued = generate_key(
            KeyId::from_ulid(IdGenerator::default().ulid_at(now)),
            Owner::parse("dev").unwrap(),
            None,
            now,
        );
        services.store.put_key(&issued.stored).await.unwrap();
        let api = services.services.api();
        let worker = services.services.worker();
        calls.take();
        Aws {
            api,
            worker,
            calls,
            dynamodb: aws_sdk_dynamodb::Client::new(&sdk),
            sqs: aws_sdk_sqs::Client::new(&sdk),
            queue_url: resources["AGENT_RUNS_QUEUE_URL"].clone(),
            webhook_queue_url: resources["AGENT_RUNS_WEBHOOK_QUEUE_URL"].clone(),
            key: issued.secret,
            services,
        }
    }

    /// Invokes the function for `operation` with the API Gateway fixture
    /// changed to this method, path and body.
    async fn invoke(&self, operation: Operation, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.invoke_with(operation, method, path, body, &[]).await
    }

    /// [`Aws::invoke`] with these headers added.
    async fn invoke_with(
        &self,
        operation: Operation,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut event: Value = serde_json::from_str(include_str!("fixtures/apigw-v2-create-run.json")).unwrap();
        for (name, value) in headers {
            event["headers"][*name] = (*value).into();
        }
        let (path, query) = path.split_once('?').unwrap_or((path, ""));
        event["rawPath"] = path.into();
        event["rawQueryString"] = query.into();
        event["requestContext"]["http"]["method"] = method.into();
        event["requestContext"]["http"]["path"] = path.into();
        event["headers"]["authorization"] = format!("Bearer {}", self.key).into();
        event["body"] = body.map_or(Value::Null, |body| body.to_string().into());
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        let response = from_api_response(self.api.handle_as(Some(operation), into_api_request(request)).await);
        assert_eq!(response.headers()["x-request-id"], "CIvM5hJ0IAMEbHg=", "API Gateway's request id");
        assert_eq!(response.headers()["content-type"], "application/json");
        let status = response.status().as_u16();
        let body = match response.into_body() {
            lambda_http::Body::Text(text) => serde_json::from_str(&text).unwrap(),
            other => panic!("JSON goes back as text: {other:?}"),
        };
        (status, body)
    }

    /// Receives what is waiting in the queue and hands it to the worker
    /// handler as an SQS event built from the fixture.
    async fn deliver(&self) -> (SqsEvent, Vec<String>) {
        let event = sqs_event(self.receive().await);
        let failures = self.run_worker(event.clone()).await;
        (event, failures)
    }

    /// The bodies of the messages waiting in the queue, taken off it.
    async fn receive(&self) -> Vec<String> {
        let received = self
            .sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .send()
            .await
            .unwrap();
        let messages = received.messages.unwrap_or_default();
        assert!(!messages.is_empty(), "a message was queued");
        for message in &messages {
            self.sqs
                .delete_message()
                .queue_url(&self.queue_url)
                .receipt_handle(message.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        messages.iter().map(|message| message.body().unwrap().to_owned()).collect()
    }

    /// The owner's count of runs not yet terminal, as stored.
    async fn active_runs(&self) -> i64 {
        self.services.store.active_runs(&Owner::parse("dev").unwrap()).await.unwrap()
    }

    async fn listed_ids(&self) -> Vec<String> {
        let (status, listed) = self.invoke(Operation::List, "GET", "/v1/agent/runs", None).await;
        assert_eq!(status, 200, "{listed}");
        listed["data"].as_array().unwrap().iter().map(|run| id(run).to_owned()).collect()
    }

    async fn run_worker(&self, event: SqsEvent) -> Vec<String> {
        let (_stop_sender, stop) = watch::channel(false);
        let response = handle_batch(&self.worker, self.services.services.adapters.queue.as_ref(), event, &stop).await;
        response.batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect()
    }
}

fn id(run: &Value) -> &str {
    run["id"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_then_worker_then_get_through_the_handlers() {
    if support::without_emulator("create_then_worker_then_get_through_the_handlers") {
        return;
    }
    let aws = Aws::new().await;
    let (status, run) =
        aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "Summarise"}))).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "queued");
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let (status, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(status, 200);
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["output"], "Summarise");

    // A function serves only its own operation.
    let (status, body) = aws.invoke(Operation::Get, "GET", "/v1/agent/runs", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_and_a_cancel_through_the_handlers() {
    if support::without_emulator("an_approval_and_a_cancel_through_the_handlers") {
        return;
    }
    let aws = Aws::new().await;
    let body = json!({"agent": "script", "input": "say start\napprove Rotate the keys\nsay end"});
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(body)).await;
    aws.deliver().await;
    let (_, waiting) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(waiting["status"], "awaiting_approval");
    let approval = waiting["pending_approvals"][0]["id"].as_str().unwrap();
    let path = format!("/v1/agent/runs/{}/approvals/{approval}", id(&run));
    let (status, decided) = aws.invoke(Operation::Decide, "POST", &path, Some(json!({"decision": "approve"}))).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["status"], "queued");
    let (first_delivery, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["output"], "start\napproved: Rotate the keys\nend");
    // A duplicate delivery of a finished run is acknowledged and changes nothing.
    assert!(aws.run_worker(first_delivery).await.is_empty());
    let (_, again) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(again, done);

    let (_, other) = aws
        .invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"agent": "script", "input": "approve Never"})))
        .await;
    aws.deliver().await;
    let (status, canceled) =
        aws.invoke(Operation::Cancel, "POST", &format!("/v1/agent/runs/{}/cancel", id(&other)), None).await;
    assert_eq!(status, 200);
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["pending_approvals"][0]["status"], "canceled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_are_reported_and_runs_that_are_done_are_acknowledged() {
    if support::without_emulator("unreadable_messages_are_reported_and_runs_that_are_done_are_acknowledged") {
        return;
    }
    let aws = Aws::new().await;
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "x"}))).await;
    let (delivered, _) = aws.deliver().await;
    let mut event = sqs_event(vec!["not json".into(), r#"{"run_id": "run_x", "owner": "dev"}"#.into()]);
    event.records.extend(delivered.records.into_iter().map(|mut record| {
        record.message_id = Some("message-duplicate".into());
        record
    }));
    let failures = aws.run_worker(event).await;
    assert_eq!(failures, vec!["message-0".to_owned(), "message-1".to_owned()]);
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(done["status"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_keeps_its_aws_call_budget() {
    if support::without_emulator("each_operation_keeps_its_aws_call_budget") {
        return;
    }
    let aws = Aws::new().await;
    let create = Some(json!({"input": "budget"}));
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create.clone()).await;
    // A place on the owner's count (a single write, apart from the run's
    // transaction, so no two creates conflict), then the run.
    assert_eq!(
        aws.calls.take(),
        ["GetItem", "UpdateItem", "TransactWriteItems", "SendMessage"],
        "cold: one key lookup"
    );

    aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create.clone()).await;
    assert_eq!(aws.calls.take(), ["UpdateItem", "TransactWriteItems", "SendMessage"], "warm: no key lookup");

    let get = format!("/v1/agent/runs/{}", id(&run));
    aws.invoke(Operation::Get, "GET", &get, None).await;
    assert_eq!(aws.calls.take(), ["GetItem"]);

    // A list reads each shard of the owner's entries at once (a shard is
    // read on only while it could hold more of the page), then the runs.
    let shards = agent_runs_shared::store::OWNER_SHARDS as usize;
    aws.invoke(Operation::List, "GET", "/v1/agent/runs?limit=20", None).await;
    let calls = aws.calls.take();
    assert_eq!(calls.iter().filter(|call| *call == "Query").count(), shards, "{calls:?}");
    assert_eq!(calls.iter().filter(|call| *call != "Query").collect::<Vec<_>>(), ["BatchGetItem"]);
    // The status index holds the runs themselves.
    aws.invoke(Operation::List, "GET", "/v1/agent/runs?status=queued&limit=1", None).await;
    assert_eq!(aws.calls.take(), vec!["Query"; shards]);
    aws.invoke(Operation::Events, "GET", &format!("{get}/events"), None).await;
    assert_eq!(aws.calls.take(), ["GetItem", "Query"], "the run (whose owner it must be), then its log");

    // The idempotency record is written in the same transaction as the run.
    let mut event: Value = serde_json::from_str(include_str!("fixtures/apigw-v2-create-run.json")).unwrap();
    event["headers"]["authorization"] = format!("Bearer {}", aws.key).into();
    event["headers"]["idempotency-key"] = "budget-1".into();
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(aws.calls.take(), ["UpdateItem", "TransactWriteItems", "SendMessage"]);
    // A replay gives back the place it took, reads the record and the run. The run is not claimed yet, so
    // the first request could still undo it: the replay pins it with a
    // write (which that undo refuses) and sends it again.
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let (place, give_back) = ("UpdateItem", "UpdateItem");
    assert_eq!(
        aws.calls.take(),
        [place, "TransactWriteItems", give_back, "GetItem", "GetItem", "PutItem", "SendMessage"]
    );
    // Once pinned, a replay only reads (and takes a place and gives it back).
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(aws.calls.take(), [place, "TransactWriteItems", give_back, "GetItem", "GetItem"]);

    let cancel = format!("/v1/agent/runs/{}/cancel", id(&run));
    aws.invoke(Operation::Cancel, "POST", &cancel, None).await;
    assert_eq!(aws.calls.take(), ["GetItem", "TransactWriteItems", give_back], "read, the terminal write, the count");

    // The worker, per echo run: read and claim, then the terminal write and
    // the giving back of its place on the count; the
    // canceled run's message costs one read and is dropped, and so does the
    // replay's second message for the pinned run (or, should the two meet
    // in one batch, a read and a claim that loses).
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let worker_calls = aws.calls.take();
    let echo_runs = aws.invoke(Operation::List, "GET", "/v1/agent/runs?status=succeeded", None).await.1["data"]
        .as_array()
        .unwrap()
        .len();
    aws.calls.take();
    assert_eq!(echo_runs, 2);
    assert!((4 * echo_runs + 2..=4 * echo_runs + 4).contains(&worker_calls.len()), "{worker_calls:?}");
    // The claim and the terminal write are transactions (each carries its
    // event); a claim that loses to the other message's is a PutItem-free try.
    let transactions = worker_calls.iter().filter(|call| *call == "TransactWriteItems").count();
    assert!((2 * echo_runs..=2 * echo_runs + 1).contains(&transactions), "{worker_calls:?}");
    assert!(!worker_calls.iter().any(|call| call == "PutItem"), "{worker_calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_runs_are_failed_unless_they_moved_on() {
    if support::without_emulator("dead_lettered_runs_are_failed_unless_they_moved_on") {
        return;
    }
    let aws = Aws::new().await;
    let (_, stuck) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "stuck"}))).await;
    let (_, done) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "done"}))).await;
    // The first message is lost to the dead-letter queue; the second is worked.
    let received = aws
        .sqs
        .receive_message()
        .queue_url(&aws.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    for message in received.messages.unwrap_or_default() {
        aws.sqs
            .delete_message()
            .queue_url(&aws.queue_url)
            .receipt_handle(message.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    let message = |run: &Value| json!({"run_id": id(run), "owner": "dev"}).to_string();
    aws.run_worker(sqs_event(vec![message(&done)])).await;

    let event = sqs_event(vec![message(&stuck), message(&done), "not json".into()]);
    let response = handle_dead_letters(&aws.services.store, aws.services.services.clock.as_ref(), event).await;
    assert!(response.batch_item_failures.is_empty());
    let (_, failed) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&stuck)), None).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"].as_str().unwrap().contains("queue message"), "{failed}");
    let (_, succeeded) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&done)), None).await;
    assert_eq!(succeeded["status"], "succeeded", "a run that moved on is left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_throttling_is_retried_then_answered_503_and_nothing_is_lost() {
    if support::without_emulator("dynamodb_throttling_is_retried_then_answered_503_and_nothing_is_lost") {
        return;
    }
    let throttling = RandomFailures::new(0.0, 1);
    let aws = Aws::with_faults(throttling.clone(), AwsError::Throttling).await;
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "kept"}))).await;
    let path = format!("/v1/agent/runs/{}", id(&run));
    aws.calls.take();

    throttling.set_share(1.0);
    for (operation, method, path, body) in [
        (Operation::Get, "GET", path.clone(), None),
        (Operation::List, "GET", "/v1/agent/runs".to_owned(), None),
        (Operation::Create, "POST", "/v1/agent/runs".to_owned(), Some(json!({"input": "refused"}))),
        (Operation::Cancel, "POST", format!("{path}/cancel"), None),
    ] {
        let (status, body) = aws.invoke(operation, method, &path, body).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "unavailable");
        assert!(!body.to_string().contains("Throttling"), "no internals: {body}");
    }
    let calls = aws.calls.take();
    assert!(calls.iter().filter(|call| *call == "GetItem").count() >= 2 * 3, "the SDK retried: {calls:?}");
    assert!(throttling.injected.load(std::sync::atomic::Ordering::SeqCst) >= 12);

    throttling.set_share(0.0);
    let (status, after) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!((status, after["status"].as_str()), (200, Some("queued")), "the run accepted before is still there");
    // The throttled create's first write, its place on the owner's count,
    // reached the table before its answer was replaced: like a timeout, a 503
    // leaves that outcome unknown, so the place stays taken (never a run
    // without one) and the run was not written. The recount gives the place
    // back once the create is surely over.
    let (_, listed) = aws.invoke(Operation::List, "GET", "/v1/agent/runs", None).await;
    let statuses: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|run| run["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["queued"]);
    assert_eq!(aws.active_runs().await, 2, "the run's place and the refused create's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_defined_agent_waits_for_approval_and_calls_its_tool_exactly_once() {
    if support::without_emulator("a_defined_agent_waits_for_approval_and_calls_its_tool_exactly_once") {
        return;
    }
    let aws = Aws::new().await;
    let model = stand_in::StandIn::start().await;
    let definition: AgentDefinition = serde_json::from_value(json!({
        "name": "janitor", "provider": "openai", "model": "stand-in-1", "base_url": format!("{}/v1", model.url),
        "system_prompt": "You keep the repository tidy.", "allow_private_network": true,
        "tools": [{"name": "delete_branch", "description": "Deletes a branch.", "method": "POST",
                   "url": format!("{}/tools/delete", model.url), "requires_approval": true,
                   "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}, "required": ["branch"]}}]
    }))
    .unwrap();
    aws.services.store.put_agent(&definition.parse().unwrap(), SystemClock.now()).await.unwrap();
    model.script(vec![
        stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        stand_in::text("Deleted old."),
    ]);

    let body = json!({"agent": "janitor", "input": "Delete the branch old"});
    let (status, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(body)).await;
    assert_eq!(status, 201, "{run}");
    let path = format!("/v1/agent/runs/{}", id(&run));
    // The first message, delivered twice in one batch: one worker parks the run.
    let first = aws.receive().await;
    assert!(aws.run_worker(sqs_event([first.clone(), first].concat())).await.is_empty());
    let (_, waiting) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!(waiting["status"], "awaiting_approval", "{waiting}");
    assert_eq!(waiting["pending_approvals"][0]["action"], r#"Call the tool `delete_branch` with {"branch":"old"}"#);
    assert_eq!(waiting["usage"], json!({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "tool_calls": 0}));
    assert!(model.tool_calls().is_empty());

    let approval = waiting["pending_approvals"][0]["id"].as_str().unwrap();
    let decide = format!("{path}/approvals/{approval}");
    let (status, _) = aws.invoke(Operation::Decide, "POST", &decide, Some(json!({"decision": "approve"}))).await;
    assert_eq!(status, 200);
    // The resumed run's message, delivered twice at once and once more later.
    let resumed = aws.receive().await;
    assert!(aws.run_worker(sqs_event([resumed.clone(), resumed.clone()].concat())).await.is_empty());
    assert!(aws.run_worker(sqs_event(resumed)).await.is_empty());

    let (_, done) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], "Deleted old.");
    assert_eq!(done["usage"], json!({"input_tokens": 20, "output_tokens": 10, "total_tokens": 30, "tool_calls": 1}));
    let calls = model.tool_calls();
    assert_eq!(calls.len(), 1, "the approved tool ran exactly once: {calls:?}");
    assert_eq!(calls[0].idempotency_key, Some(format!("{}/call_1", id(&run))));
    assert_eq!(model.model_requests().len(), 2);
}

/// The events function: the log in pages, `wait` woken by a write (here by
/// polling), a run that has ended answered at once, `Accept:
/// text/event-stream` answered in JSON (API Gateway cannot stream), and
/// bad input refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_function_answers_the_log_in_pages_and_waits_for_more() {
    if support::without_emulator("the_events_function_answers_the_log_in_pages_and_waits_for_more") {
        return;
    }
    let aws = Aws::new().await;
    let create = Some(json!({"agent": "script", "input": "say one\nsay two"}));
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create).await;
    let path = format!("/v1/agent/runs/{}/events", id(&run));
    let types = |page: &Value| -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap().to_owned()).collect()
    };
    let (status, page) = aws.invoke(Operation::Events, "GET", &path, None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(types(&page), ["run.created"]);
    assert_eq!((page["next_after"].as_u64(), page["has_more"].as_bool()), (Some(1), Some(false)));
    assert_eq!(page["data"][0]["run_id"], run["id"]);
    assert_eq!(page["data"][0]["data"], run, "run.created shows the run as created");

    // Someone waits for what comes after run.created while the worker runs it.
    let after_created = format!("{path}?after=1&wait=15");
    let waiting = aws.invoke(Operation::Events, "GET", &after_created, None);
    let working = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        aws.deliver().await
    };
    let ((status, woken), _) = tokio::join!(waiting, working);
    assert_eq!(status, 200);
    assert_eq!(types(&woken).first().map(String::as_str), Some("run.started"), "{woken}");

    let (_, page) = aws.invoke(Operation::Events, "GET", &format!("{path}?after=1&limit=2"), None).await;
    assert_eq!(types(&page), ["run.started", "output.appended"]);
    assert_eq!((page["next_after"].as_u64(), page["has_more"].as_bool()), (Some(3), Some(true)));
    assert_eq!(page["data"][1]["data"], json!({"text": "one", "truncated": false}));
    let accept = [("accept", "text/event-stream")];
    let (_, rest) = aws.invoke_with(Operation::Events, "GET", &format!("{path}?after=3"), None, &accept).await;
    assert_eq!(types(&rest), ["output.appended", "run.succeeded"], "JSON, not a stream");
    assert_eq!(rest["data"][1]["data"]["output"], "one\ntwo");
    assert!(rest["data"][1]["id"].as_str().unwrap().starts_with("evt_"));

    // The run has ended: nothing more will come, so a wait is not held.
    let started = std::time::Instant::now();
    let (_, end) = aws.invoke(Operation::Events, "GET", &format!("{path}?after=5&wait=20"), None).await;
    assert_eq!((end["data"].as_array().map(Vec::len), end["next_after"].as_u64()), (Some(0), Some(5)));
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "answered without waiting out the 20 s");

    for (query, param) in [
        ("after=-1", "after"),
        ("after=7", "after"),
        ("after=x", "after"),
        ("wait=21", "wait"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("since=1", "since"),
    ] {
        let (status, error) = aws.invoke(Operation::Events, "GET", &format!("{path}?{query}"), None).await;
        assert_eq!((status, error["error"]["param"].as_str()), (400, Some(param)), "{query}: {error}");
    }
    let unknown = format!("/v1/agent/runs/run_{}/events", ulid::Ulid::new());
    assert_eq!(aws.invoke(Operation::Events, "GET", &unknown, None).await.0, 404);
}

/// A transaction DynamoDB cancels for a conflict with another one wrote
/// nothing: the store sends it again, so a create is not refused and a worker
/// does not hand back a run it just finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_conflicts_are_sent_again() {
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

    // The worker's writes: the claim (a transaction with its run.started
    // event), which conflicts once, then the terminal transaction.
    conflicts.fail_next(1);
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty(), "the run is not handed back: {failures:?}");
    let worker_calls = aws.calls.take();
    assert_eq!(worker_calls.iter().filter(|call| *call == "TransactWriteItems").count(), 3, "{worker_calls:?}");
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!((done["status"].as_str(), done["output"].as_str()), (Some("succeeded"), Some("once")));
    assert_eq!(aws.active_runs().await, 0, "the run ended once");
}

/// A single write refused because a transaction holds its item (here the
/// write that pins a replayed create's run) is sent again, not answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_writes_refused_for_a_transaction_under_way_are_sent_again() {
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
async fn transaction_conflicts_that_persist_answer_503() {
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
async fn a_call_without_an_answer_ends_at_the_call_timeout() {
    if support::without_emulator("a_call_without_an_answer_ends_at_the_call_timeout") {
        return;
    }
    use agent_runs_shared::sdk::{STORE_ATTEMPT_TIMEOUT, STORE_CALL_TIMEOUT};
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

/// Every record of the table's stream so far, as the Lambda event a
/// stream's event source mapping would send (the emulator's DynamoDB
/// Streams API, spoken as JSON: no SDK crate for one test).
async fn stream_event(aws: &Aws) -> aws_lambda_events::event::dynamodb::Event {
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
async fn subscribe_to_run_created(
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

async fn delivery_event(aws: &Aws, queue_url: &str) -> SqsEvent {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_go_from_the_stream_through_the_delivery_queue_and_verify_with_the_standard_library() {
    use agent_runs_shared::lambda::{handle_deliveries, handle_stream};
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
async fn a_run_created_is_held_until_its_create_is_answered_and_never_sent_for_an_undone_create() {
    use agent_runs_shared::domain::{Clock, ManualClock, Owner, RunId};
    use agent_runs_shared::lambda::handle_deliveries;
    use agent_runs_shared::store::RunStore;
    use agent_runs_shared::webhooks::{CREATE_SETTLED_AFTER, WebhookEngine};
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
    // Messages waiting on the queue, delayed or not (not those received).
    let waiting = || async {
        use aws_sdk_sqs::types::QueueAttributeName::{ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed};
        let attributes = aws
            .sqs
            .get_queue_attributes()
            .queue_url(&aws.webhook_queue_url)
            .attribute_names(ApproximateNumberOfMessages)
            .attribute_names(ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .unwrap();
        let count = attributes.attributes.unwrap_or_default();
        [ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed]
            .iter()
            .map(|name| count[name].parse::<u32>().unwrap())
            .sum::<u32>()
    };

    // A run no worker has taken yet: its run.created waits, as a delayed message.
    let (_, undone) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "a"}))).await;
    let now = aws.services.services.clock.as_ref();
    let engine = aws.services.services.webhook_engine(None);
    let response = handle_deliveries(&engine, &aws.services.store, &queue, message_for(&undone)).await;
    assert!(response.batch_item_failures.is_empty());
    assert!(received(receiver.clone()).await.is_empty(), "not sent while its create may still be undone");
    assert_eq!(waiting().await, 1, "held as a delayed message");
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
    assert_eq!(waiting().await, 0, "and not held again");

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
    assert_eq!(waiting().await, 0, "neither was held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_messages_for_the_same_attempt_send_twice_under_one_id_and_queue_one_next_attempt() {
    use agent_runs_shared::lambda::handle_deliveries;
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
    let waiting: u32 = [ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed]
        .iter()
        .map(|name| attributes[name].parse::<u32>().unwrap())
        .sum();
    assert_eq!(waiting, 1, "one series of retries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_lists_page_through_every_endpoint_and_attempt_on_dynamodb() {
    use agent_runs_shared::domain::{DeliveryAttempt, DeliveryId, EndpointHealth, Timestamp, WebhookId};
    use agent_runs_shared::store::WebhookStore;

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
