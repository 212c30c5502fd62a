//! `agent-runs gateway`: the Lambda functions run locally the way AWS
//! invokes them. HTTP requests become API Gateway (HTTP API, payload 2.0)
//! events routed like template.yaml's routes; SQS messages are polled and
//! handed to the worker handler as SQS events with partial batch failures;
//! the sweeper runs on a timer. The handlers are the functions' own, on
//! DynamoDB and SQS (an emulator through `AWS_ENDPOINT_URL`).

use agent_runs_ports::error_chain;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agent_runs_lambda::AwsServices;
use agent_runs_lambda::{from_api_response, handle_batch, into_api_request};
use agent_runs_platform::aws_sdk::sdk_config;
use agent_runs_service::api::routes::{self, Resolved};
use agent_runs_service::api::{Api, Operation};
use agent_runs_service::config::Config;
use aws_lambda_events::event::sqs::SqsEvent;
use aws_sdk_sqs::types::MessageSystemAttributeName;
use base64::Engine;
use bytes::Bytes;
use clap::Args;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::http_server::serve_with;
use crate::keys::Error;

/// API Gateway's own limit on a request payload.
const GATEWAY_MAX_BODY: usize = 10 * 1024 * 1024;

#[derive(Args)]
pub struct GatewayArgs {
    /// The address API Gateway's stand-in listens on; port 0 picks a free one.
    #[arg(long, env = "AGENT_RUNS_ADDR", default_value = "127.0.0.1:9000")]
    addr: SocketAddr,
    /// Concurrent SQS pollers, each taking batches of up to 10 messages.
    #[arg(long, env = "AGENT_RUNS_WORKERS", default_value_t = 4)]
    pollers: usize,
    /// How often the sweeper runs, in milliseconds (a minute on AWS).
    #[arg(long, env = "AGENT_RUNS_SWEEP_MS", default_value_t = 60_000)]
    sweep_ms: u64,
    /// Seconds a received message stays invisible; a failed one comes back after it.
    #[arg(long, default_value_t = 5)]
    visibility_secs: i32,
}

/// Which function API Gateway would invoke: the route table's, else `$default`.
fn route(method: &http::Method, path: &str) -> (String, Option<Operation>) {
    match routes::resolve(method, path, false) {
        Resolved::Found(route, _) if route.has_gateway_route() => (route.key(), Some(route.operation)),
        _ => ("$default".into(), None),
    }
}

/// The API Gateway v2 event for an HTTP request.
fn event(
    request_id: &str,
    method: &str,
    path: &str,
    query: &str,
    headers: &http::HeaderMap,
    body: &[u8],
    route_key: &str,
) -> serde_json::Value {
    let mut merged = serde_json::Map::new();
    for name in headers.keys() {
        let values: Vec<&str> = headers.get_all(name).iter().filter_map(|value| value.to_str().ok()).collect();
        merged.insert(name.as_str().to_owned(), values.join(",").into());
    }
    let (body, encoded) = match std::str::from_utf8(body) {
        _ if body.is_empty() => (serde_json::Value::Null, false),
        Ok(text) => (text.into(), false),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(body).into(), true),
    };
    serde_json::json!({
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": path,
        "rawQueryString": query,
        "headers": merged,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": "localhost",
            "domainPrefix": "localhost",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1", "userAgent": ""},
            "requestId": request_id,
            "routeKey": route_key,
            "stage": "$default",
            "time": "",
            "timeEpoch": 0
        },
        "body": body,
        "isBase64Encoded": encoded
    })
}

async fn invoke(api: &Api, request: Request<Incoming>, request_id: String) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let Ok(body) = Limited::new(body, GATEWAY_MAX_BODY).collect().await.map(|collected| collected.to_bytes()) else {
        let mut response = Response::new(Full::new(Bytes::from_static(br#"{"message":"Request Entity Too Large"}"#)));
        *response.status_mut() = http::StatusCode::PAYLOAD_TOO_LARGE;
        return response;
    };
    let method = parts.method.as_str();
    let path = parts.uri.path();
    let (route_key, operation) = route(&parts.method, path);
    let event = event(&request_id, method, path, parts.uri.query().unwrap_or(""), &parts.headers, &body, &route_key);
    let request = match lambda_http::request::from_str(&event.to_string()) {
        Ok(request) => request,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "could not build the API Gateway event");
            let mut response = Response::new(Full::new(Bytes::from_static(br#"{"message":"Internal Server Error"}"#)));
            *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            return response;
        }
    };
    let response = from_api_response(api.handle_as(operation, into_api_request(request)).await);
    response.map(|body| Full::new(Bytes::from(body.to_vec())))
}

/// The event source mapping: receive, invoke the worker handler, delete
/// what it did not report as failed.
async fn poll(
    aws: Arc<AwsServices>,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    visibility: i32,
    mut stop: watch::Receiver<bool>,
) {
    let worker = aws.services.worker();
    let queue = aws.services.adapters.queue.clone();
    loop {
        let received = tokio::select! {
            _ = stop.changed() => return,
            received = sqs
                .receive_message()
                .queue_url(&queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .visibility_timeout(visibility)
                .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
                .send() => received,
        };
        let messages = match received {
            Ok(output) => output.messages.unwrap_or_default(),
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "receive failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let records: Vec<serde_json::Value> = messages
            .iter()
            .map(|message| {
                serde_json::json!({
                    "messageId": message.message_id,
                    "receiptHandle": message.receipt_handle,
                    "body": message.body,
                    "md5OfBody": message.md5_of_body,
                    "attributes": {},
                    "messageAttributes": {},
                    "eventSource": "aws:sqs",
                    "eventSourceARN": "arn:aws:sqs:local:000000000000:runs",
                    "awsRegion": "local"
                })
            })
            .collect();
        let event: SqsEvent = match serde_json::from_value(serde_json::json!({ "Records": records })) {
            Ok(event) => event,
            Err(error) => {
                tracing::error!(error = %error_chain(&error), "could not build the SQS event");
                continue;
            }
        };
        let response = handle_batch(&worker, queue.as_ref(), event, &stop).await;
        let failed: Vec<&str> =
            response.batch_item_failures.iter().map(|failure| failure.item_identifier.as_str()).collect();
        for message in &messages {
            if failed.contains(&message.message_id().unwrap_or_default()) {
                continue;
            }
            if let Some(handle) = message.receipt_handle() {
                let _ = sqs.delete_message().queue_url(&queue_url).receipt_handle(handle).send().await;
            }
        }
    }
}

pub async fn run(args: GatewayArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    let listener = TcpListener::bind(args.addr).await?;
    let mut config = Config::from_env()?;
    // Receipts name this gateway's URL, as the stack's name its API's.
    config.issuer.get_or_insert(crate::http_server::base_url(listener.local_addr()?));
    let aws = Arc::new(AwsServices::from_config(config).await?);
    let queue_url = aws.services.config.queue_url.clone().ok_or("AGENT_RUNS_QUEUE_URL is not set")?;
    let sqs = aws_sdk_sqs::Client::new(&sdk_config().await);
    let (stop_sender, stop) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.pollers.max(1) {
        tasks.spawn(poll(aws.clone(), sqs.clone(), queue_url.clone(), args.visibility_secs, stop.clone()));
    }
    let sweeper = aws.services.sweeper();
    let sweeping = aws.clone();
    let mut sweep_stop = stop.clone();
    let sweep_every = Duration::from_millis(args.sweep_ms.max(10));
    tasks.spawn(async move {
        let mut ticks = tokio::time::interval(sweep_every);
        loop {
            tokio::select! {
                _ = sweep_stop.changed() => return,
                _ = ticks.tick() => {
                    sweeping.services.publish_signing_key().await;
                    if let Err(error) = sweeper.sweep().await {
                        tracing::warn!(error = %error_chain(&error), "sweep failed");
                    }
                }
            }
        }
    });

    let api = Arc::new(aws.services.api());
    println!("Listening on http://{} (Lambda handlers on table {})", listener.local_addr()?, aws.store.table());
    std::io::Write::flush(&mut std::io::stdout())?;
    let counter = Arc::new(AtomicU64::new(0));
    serve_with(listener, shutdown, move |request| {
        let api = api.clone();
        let request_id = format!("local-{:012}", counter.fetch_add(1, Ordering::Relaxed));
        async move { invoke(&api, request, request_id).await }
    })
    .await;
    let _ = stop_sender.send(true);
    while tasks.join_next().await.is_some() {}
    agent_runs_platform::telemetry::shutdown().await;
    Ok(())
}
