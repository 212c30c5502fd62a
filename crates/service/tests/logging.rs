//! What the service logs: a failure's whole cause, and the request, owner
//! and run it belongs to. Its own test binary, so that no other test's
//! logging runs in the process while the collecting subscriber is set.

use std::sync::{Arc, Mutex};

use agent_runs_domain::{Clock, IdGenerator, KeyId, Owner, SystemClock};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::queue::InProcessQueue;
use agent_runs_ports::store::{KeyStore, RunStore};
use agent_runs_service::auth::generate_key;
use agent_runs_service::config::Config;
use agent_runs_service::services::{Adapters, CacheDefaults, Services};
use agent_runs_testkit::faults::{FailNext, Faults};
use bytes::Bytes;
use tokio::sync::watch;

/// Collects what the service logs, for the test to read.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn request(method: &str, path: &str, key: &str, body: &str) -> http::Request<Bytes> {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_owned()))
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_request_and_a_run_log_their_cause_with_request_owner_run_and_trace() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap());
    let issued = generate_key(
        KeyId::from_ulid(IdGenerator::default().ulid_at(SystemClock.now())),
        Owner::parse("acme").unwrap(),
        None,
        SystemClock.now(),
    );
    sqlite.put_key(&issued.stored).await.unwrap();
    let outage = FailNext::new();
    let (queue, receiver) = InProcessQueue::new();
    let adapters = Adapters {
        runs: Faults::store(sqlite.clone(), outage.clone()),
        keys: sqlite.clone(),
        agents: sqlite.clone(),
        webhooks: sqlite.clone(),
        queue: Arc::new(queue),
        policies: sqlite.clone(),
    };
    let services = Services::new(Config::from_lookup(|_| None).unwrap(), adapters, CacheDefaults::LOCAL);
    let api = services.api();

    let created = api.handle(request("POST", "/v1/agent/runs", &issued.secret, r#"{"input": "hi"}"#)).await;
    assert_eq!(created.status(), 201);
    let id = serde_json::from_slice::<serde_json::Value>(created.body()).unwrap()["id"].as_str().unwrap().to_owned();

    // A store outage while reading the run: a 503, its cause in the log.
    outage.fail_next(1);
    let response = api.handle(request("GET", &format!("/v1/agent/runs/{id}"), &issued.secret, "")).await;
    assert_eq!(response.status(), 503);
    let request_id = response.headers()["x-request-id"].to_str().unwrap().to_owned();

    let (_stop, stop) = watch::channel(false);
    let message = receiver.receive().await.unwrap();
    services.worker().process(&message, &stop).await.unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let failed = text.lines().find(|line| line.contains("request failed")).expect("the failure is logged");
    for expected in [request_id.as_str(), "owner=acme", id.as_str(), "injected fault in get"] {
        assert!(failed.contains(expected), "{expected} in: {failed}");
    }
    // The run's trace, as stored (the run's JSON shows it only where traces
    // are exported).
    let stored = sqlite.get(&Owner::parse("acme").unwrap(), id.parse().unwrap()).await.unwrap().unwrap();
    let trace_id = stored.trace.expect("a new run has its trace").trace_id_hex();
    assert!(
        text.lines().any(|line| line.contains("run{")
            && line.contains(&id)
            && line.contains("owner=acme")
            && line.contains(&format!("trace_id={trace_id}"))),
        "the worker's lines carry the run, its owner and its trace:\n{text}"
    );
    assert!(!String::from_utf8_lossy(response.body()).contains("injected"), "the client sees no cause");
}
