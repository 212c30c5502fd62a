//! The Lambda handlers fed API Gateway v2 and SQS event fixtures, on
//! DynamoDB and SQS in the AWS API emulator: the end-to-end path create →
//! SQS → worker → get, approvals and cancels, and the budget of AWS calls
//! each operation makes, counted by an SDK interceptor.

#[path = "../support/mod.rs"]
mod support;

use agent_runs_testkit::stand_in;
#[path = "../../src/template.rs"]
#[allow(dead_code)]
mod template;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_runs_domain::AgentDefinition;
use agent_runs_domain::{Clock, IdGenerator, KeyId, Owner, RunId, SystemClock};
use agent_runs_lambda::AwsServices;
use agent_runs_lambda::{from_api_response, handle_batch, handle_dead_letters, into_api_request};
use agent_runs_ports::store::{AgentStore, KeyStore, RunStore, StoreError};
use agent_runs_service::api::{Api, Operation};
use agent_runs_service::auth::generate_key;
use agent_runs_service::config::Config;
use agent_runs_service::worker::Worker;
use agent_runs_testkit::faults::{AwsError, AwsErrorInterceptor, FailNext, FaultPlan, Healthy, RandomFailures};
use agent_runs_testkit::units::UnitMeter;
use aws_lambda_events::event::sqs::SqsEvent;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;
use serde_json::{Value, json};
use support::events::sqs_event;
use tokio::sync::watch;

mod conflicts;
mod costs;
mod runs;
mod webhooks;

tokio::task_local! {
    /// The Lambda function whose handler is running (as template.yaml
    /// names it), so each AWS call can be held to that function's grants.
    static FUNCTION: &'static str;
}

/// Whether template.yaml lets `function` send `operation`.
fn granted(function: &str, operation: &str) -> bool {
    let Some(function) = template::FUNCTIONS.iter().find(|candidate| candidate.name == function) else {
        return false;
    };
    function.grants.iter().any(|grant| match grant {
        template::Grant::Table(actions) | template::Grant::Queue(_, actions) | template::Grant::SigningKey(actions) => {
            actions.contains(&operation)
        }
        template::Grant::Indexes(_) => operation == "Query",
        template::Grant::Bedrock => false,
    })
}

/// The IAM actions that allow `operation` with this request body: a
/// transaction is allowed by each of its items' actions, an SQS batch by
/// the action of one message (`sqs:SendMessage` allows `SendMessageBatch`).
fn iam_actions(operation: &str, body: Option<&[u8]>) -> Vec<String> {
    if let Some(one) = operation.strip_suffix("Batch") {
        return vec![one.to_owned()];
    }
    if operation != "TransactWriteItems" {
        return vec![operation.to_owned()];
    }
    let body: Value = serde_json::from_slice(body.unwrap_or_default()).unwrap_or_default();
    let items = body["TransactItems"].as_array().cloned().unwrap_or_default();
    let kinds = items.iter().filter_map(Value::as_object).flat_map(|item| item.keys().cloned().collect::<Vec<_>>());
    kinds
        .map(|kind| match kind.as_str() {
            "ConditionCheck" => "ConditionCheckItem".to_owned(),
            kind => format!("{kind}Item"),
        })
        .collect()
}

/// Records the name of every AWS operation the clients send, and fails a
/// call a handler makes that its function's IAM role would refuse.
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
        if let Ok(function) = FUNCTION.try_with(|function| *function) {
            for action in iam_actions(operation, context.request().body().bytes()) {
                assert!(
                    granted(function, &action),
                    "the {function} function sends {action}, which template.yaml does not grant it"
                );
            }
        }
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
    /// What the DynamoDB calls would bill, when metered.
    units: Option<UnitMeter>,
    /// A client of the table without the interceptors, to look at items.
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    webhook_queue_url: String,
    key: String,
}

impl Aws {
    /// Stores the agent `definition` (its JSON), as `agents put` would.
    async fn define(&self, definition: Value) {
        let definition: AgentDefinition = serde_json::from_value(definition).unwrap();
        self.services.store.put_agent(&definition.parse().unwrap(), SystemClock.now()).await.unwrap();
    }

    async fn new() -> Aws {
        Self::with_faults(Arc::new(Healthy), AwsError::Throttling).await
    }

    /// DynamoDB calls picked by `plan` are answered with `error`.
    async fn with_faults(plan: Arc<dyn FaultPlan>, error: AwsError) -> Aws {
        Self::with(plan, error, &[]).await
    }

    /// With a [`UnitMeter`] on the DynamoDB client, one item of the
    /// active-run count (a limit of 8), so that every create finds it in
    /// use, and webhook endpoints on this machine allowed.
    async fn metered() -> Aws {
        let settings = [("AGENT_RUNS_MAX_ACTIVE_RUNS", "8"), ("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true")];
        Self::build(Arc::new(Healthy), AwsError::Throttling, &settings, true).await
    }

    /// With more configuration.
    async fn with(plan: Arc<dyn FaultPlan>, error: AwsError, settings: &[(&str, &str)]) -> Aws {
        Self::build(plan, error, settings, false).await
    }

    async fn build(plan: Arc<dyn FaultPlan>, error: AwsError, settings: &[(&str, &str)], metered: bool) -> Aws {
        let mut resources: HashMap<String, String> = support::create_aws_resources().into_iter().collect();
        resources.extend(settings.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        let config = Config::from_lookup(|name| resources.get(name).cloned()).unwrap();
        let sdk = support::aws_sdk_config().await;
        let calls = CallLog::default();
        let mut dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk)
            .interceptor(calls.clone())
            .interceptor(AwsErrorInterceptor::new(plan, error));
        let units = match metered {
            true => Some(UnitMeter::new(aws_sdk_dynamodb::Client::new(&sdk), &resources["AGENT_RUNS_TABLE"]).await),
            false => None,
        };
        if let Some(meter) = &units {
            dynamodb = dynamodb.interceptor(meter.clone());
        }
        let dynamodb = dynamodb.build();
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
        if let Some(meter) = &units {
            meter.take();
        }
        Aws {
            api,
            worker,
            calls,
            units,
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
        let mut event: Value = serde_json::from_str(include_str!("../fixtures/apigw-v2-create-run.json")).unwrap();
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
        let function =
            agent_runs_service::api::ROUTES.iter().find(|route| route.operation == operation).unwrap().function;
        let handled = self.api.handle_as(Some(operation), into_api_request(request));
        let response = from_api_response(FUNCTION.scope(function, handled).await);
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
        let handled = handle_batch(&self.worker, self.services.services.adapters.queue.as_ref(), event, &stop);
        let response = FUNCTION.scope("worker", handled).await;
        response.batch_item_failures.into_iter().map(|failure| failure.item_identifier).collect()
    }
}

/// `janitor`: an agent on the model stand-in at `url` whose one tool,
/// `delete_branch`, needs a person's approval.
fn janitor(url: &str) -> Value {
    json!({
        "name": "janitor", "provider": "openai", "model": "stand-in-1", "base_url": format!("{url}/v1"),
        "system_prompt": "You keep the repository tidy.", "allow_private_network": true,
        "tools": [{"name": "delete_branch", "description": "Deletes a branch.", "method": "POST",
                   "url": format!("{url}/tools/delete"), "requires_approval": true,
                   "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}, "required": ["branch"]}}]
    })
}

fn id(run: &Value) -> &str {
    run["id"].as_str().unwrap()
}
