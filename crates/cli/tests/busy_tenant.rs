//! One busy tenant on the Lambda handlers (the code the gateway and AWS
//! run), against the AWS API emulator with what it does not model of
//! DynamoDB: per-item and per-partition write rates and transaction
//! conflicts ([`CapacityModel`], scaled down to 20 write units a second so
//! this machine goes past them). Runs are created by many callers at once,
//! then worked by concurrent SQS batches; every create must be answered 201
//! and every run must succeed: throttles are absorbed, never shown, and no
//! two writes conflict. `BUSY_TENANT_RUNS` and `BUSY_TENANT_CALLERS` scale it up for the
//! figures in docs/benchmarks.md (`infra/bench.sh` prints them).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use agent_runs_aws::{ABANDONED_CREATE, RECOUNT_EVERY};
use agent_runs_domain::{Clock, IdGenerator, KeyId, Owner, RunStatus, SystemClock};
use agent_runs_lambda::AwsServices;
use agent_runs_lambda::{from_api_response, handle_batch, into_api_request};
use agent_runs_ports::store::{KeyStore, ListRequest, RunLists, Upkeep};
use agent_runs_service::api::{Api, Operation};
use agent_runs_service::auth::generate_key;
use agent_runs_service::config::Config;
use agent_runs_testkit::faults::{CapacityLimits, CapacityModel};
use serde_json::{Value, json};
use support::events::sqs_event;
use tokio::sync::{Mutex, watch};

/// DynamoDB's 1,000 write units a second, scaled down fifty times: the
/// emulator copies a table for every transaction, so one tenant's creates
/// reach some tens a second here.
const LIMITS: CapacityLimits = CapacityLimits { item: 20.0, partition: 20.0 };

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

fn create_event(key: &str) -> lambda_http::Request {
    let mut event: Value = serde_json::from_str(include_str!("fixtures/apigw-v2-create-run.json")).unwrap();
    event["headers"]["authorization"] = format!("Bearer {key}").into();
    event["body"] = json!({"input": "busy"}).to_string().into();
    lambda_http::request::from_str(&event.to_string()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tenant_sees_no_throttle_or_conflict() {
    if support::without_emulator("a_busy_tenant_sees_no_throttle_or_conflict") {
        return;
    }
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let runs = setting("BUSY_TENANT_RUNS", 60);
    let callers = setting("BUSY_TENANT_CALLERS", 6);
    let mut resources: HashMap<String, String> = support::create_aws_resources().into_iter().collect();
    // A busy owner's limit: its count spread over all 256 items.
    resources.insert("AGENT_RUNS_MAX_ACTIVE_RUNS".into(), (runs * 2).max(2_048).to_string());
    let config = Config::from_lookup(|name| resources.get(name).cloned()).unwrap();
    let sdk = support::aws_sdk_config().await;
    let model = CapacityModel::new(LIMITS);
    let counts = model.counts.clone();
    let dynamodb = aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(model).build();
    let services = AwsServices::new(config, dynamodb, aws_sdk_sqs::config::Builder::from(&sdk).build()).unwrap();
    let owner = Owner::parse("busy").unwrap();
    let now = SystemClock.now();
    let issued = generate_key(KeyId::from_ulid(IdGenerator::default().ulid_at(now)), owner.clone(), None, now);
    services.store.put_key(&issued.stored).await.unwrap();
    let api: Arc<Api> = Arc::new(services.services.api());

    // Creates: `callers` at once, until `runs` are answered.
    let answered = Arc::new(Mutex::new(BTreeMap::<u16, usize>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let (api, answered, key) = (api.clone(), answered.clone(), issued.secret.clone());
        tasks.push(tokio::spawn(async move {
            for _ in (caller..runs).step_by(callers) {
                let response = from_api_response(
                    api.handle_as(Some(Operation::Create), into_api_request(create_event(&key))).await,
                );
                *answered.lock().await.entry(response.status().as_u16()).or_default() += 1;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let create_seconds = started.elapsed().as_secs_f64();
    let create_model = (counts.throttled.load(Ordering::Relaxed), counts.conflicts.load(Ordering::Relaxed));

    // Completions: the queue's messages in batches of three, one at a time
    // (the emulator answers one DynamoDB request at a time; more at once
    // only time out).
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_url = resources["AGENT_RUNS_QUEUE_URL"].clone();
    let worker = Arc::new(services.services.worker());
    let queue = services.services.adapters.queue.clone();
    let failures = Arc::new(Mutex::new(0usize));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..1 {
        let (sqs, queue_url, worker, queue, failures) =
            (sqs.clone(), queue_url.clone(), worker.clone(), queue.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            let mut retry: Vec<String> = Vec::new();
            loop {
                let mut bodies = std::mem::take(&mut retry);
                if bodies.is_empty() {
                    let received = sqs
                        .receive_message()
                        .queue_url(&queue_url)
                        .max_number_of_messages(3)
                        .wait_time_seconds(1)
                        .send()
                        .await
                        .unwrap();
                    for message in received.messages() {
                        bodies.push(message.body().unwrap().to_owned());
                        let handle = message.receipt_handle().unwrap();
                        sqs.delete_message().queue_url(&queue_url).receipt_handle(handle).send().await.unwrap();
                    }
                }
                if bodies.is_empty() {
                    return;
                }
                let (_stop_sender, stop) = watch::channel(false);
                let response = handle_batch(&worker, queue.as_ref(), sqs_event(bodies.clone()), &stop).await;
                *failures.lock().await += response.batch_item_failures.len();
                // SQS would redeliver a failed message; it is sent again at once.
                for failure in response.batch_item_failures {
                    let index = failure.item_identifier.trim_start_matches("message-").parse::<usize>().unwrap();
                    retry.push(bodies[index].clone());
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let complete_seconds = started.elapsed().as_secs_f64() - 1.0; // less the last, empty receive

    let mut statuses = BTreeMap::<&str, usize>::new();
    let mut before = None;
    loop {
        let page =
            services.store.list(&owner, ListRequest { status: None, thread: None, before, limit: 100 }).await.unwrap();
        for run in &page.runs {
            *statuses.entry(run.status.as_str()).or_default() += 1;
        }
        before = page.runs.last().map(|run| run.id);
        if !page.has_more {
            break;
        }
    }
    let answered = answered.lock().await.clone();
    let failures = *failures.lock().await;
    // Only a write whose outcome was unknown (a timeout: the emulator is
    // slow) can leave a place on the count taken; the recount gives it back.
    let left_taken = services.store.active_runs(&owner).await.unwrap();
    let unknown =
        failures + answered.iter().filter(|(status, _)| **status != 201).map(|(_, count)| count).sum::<usize>();
    let recount_at = SystemClock.now().plus(RECOUNT_EVERY + ABANDONED_CREATE);
    let settled = services.store.settle_counts(recount_at, None).await.unwrap();
    println!(
        "busy tenant: {runs} creates by {callers} callers in {create_seconds:.2} s ({:.0}/s), answered {answered:?}; \
         model turned away {} (throttled) + {} (conflicts) writes while creating, {} + {} in all; \
         completions in {complete_seconds:.2} s ({:.0}/s), {failures} batch item failures; runs {statuses:?}; \
         places left taken {left_taken}, given back by the recount {}",
        runs as f64 / create_seconds,
        create_model.0,
        create_model.1,
        counts.throttled.load(Ordering::Relaxed),
        counts.conflicts.load(Ordering::Relaxed),
        runs as f64 / complete_seconds.max(0.001),
        settled.given_back,
    );
    assert_eq!(answered, BTreeMap::from([(201, runs)]), "every create is answered 201");
    assert_eq!(statuses, BTreeMap::from([(RunStatus::Succeeded.as_str(), runs)]), "every run succeeded");
    assert!(left_taken <= unknown as i64, "{left_taken} places left taken by {unknown} calls of unknown outcome");
    assert_eq!(services.store.active_runs(&owner).await.unwrap(), 0, "the active-run count is back to 0");
    assert_eq!(
        counts.conflicts.load(Ordering::Relaxed),
        0,
        "no two writes of different runs share a transaction's item"
    );
}
