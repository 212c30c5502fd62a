//! `agent-runs serve`: every operation on one port, SQLite, in-process queue
//! and workers. No AWS needed.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_runs_domain::Owner;
use agent_runs_embedded::LocalKey;
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{InProcessQueue, RunQueue};
use agent_runs_ports::receipts::Receipts;
use agent_runs_ports::store::KeyStore;
use agent_runs_service::config::{Config, MIN_WORKER_DEADLINE_MARGIN_MS};
use agent_runs_service::metrics::{Measured, MetricsSink, Registry};
use agent_runs_service::services::{Adapters, CacheDefaults, Services};
use agent_runs_service::webhooks::OutboxWorker;
use agent_runs_service::worker::{PoolSettings, WorkerPool};
use clap::Args;
use tokio::net::TcpListener;

use crate::http_server;
use crate::keys::{Error, issue};

#[derive(Args)]
pub struct ServeArgs {
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, env = "AGENT_RUNS_ADDR", default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// How many runs execute at once.
    #[arg(long, env = "AGENT_RUNS_WORKERS", default_value_t = 16)]
    workers: usize,
    /// The most runs of one owner that execute at once (default: half the workers).
    #[arg(long, env = "AGENT_RUNS_WORKERS_PER_OWNER")]
    workers_per_owner: Option<usize>,
    /// How often the sweeper looks for stuck runs, in milliseconds.
    #[arg(long, env = "AGENT_RUNS_SWEEP_MS", default_value_t = 1_000)]
    sweep_ms: u64,
    /// `full` adds an fsync per write, for power-loss durability.
    #[arg(long, env = "AGENT_RUNS_SQLITE_SYNC", default_value = "normal", value_parser = ["normal", "full"])]
    sqlite_sync: String,
    /// Seconds a connection may take to send a request's line and headers
    /// (also how long an idle connection is kept open).
    #[arg(long, env = "AGENT_RUNS_HEADER_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive; beyond them it is answered 408.
    #[arg(long, env = "AGENT_RUNS_BODY_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,
    /// Seconds an answer may stay unwritable (its client stopped reading)
    /// before the connection is closed.
    #[arg(long, env = "AGENT_RUNS_WRITE_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    write_timeout_secs: u64,
    /// Connections open at once; beyond them new ones wait to be accepted.
    #[arg(long, env = "AGENT_RUNS_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Event streams and waiting polls held at once, all owners together
    /// (default: half the connections, so ordinary requests always have
    /// the other half).
    #[arg(long, env = "AGENT_RUNS_MAX_HELD", value_parser = clap::value_parser!(u32).range(1..))]
    max_held: Option<u32>,
    /// Serve Prometheus metrics at http://<this address>/metrics, apart from
    /// the API (no key; keep it on a private address). Off when not set.
    #[arg(long, env = "AGENT_RUNS_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
}

pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("AGENT_RUNS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var("AGENT_RUNS_LOG_FORMAT").is_ok_and(|format| format == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

pub async fn run(args: ServeArgs, db: &Path) -> Result<(), Error> {
    init_logging();
    let mut config = Config::from_env()?;
    let half_the_connections = u32::try_from(args.max_connections / 2).unwrap_or(u32::MAX).max(1);
    let connections = u32::try_from(args.max_connections).unwrap_or(u32::MAX);
    config.limits.holds.total = args.max_held.unwrap_or(half_the_connections).min(connections);
    let durability = if args.sqlite_sync == "full" { Durability::Full } else { Durability::Process };
    let store =
        SqliteStore::open_for_serving(db, durability).map_err(|error| error_chain(&error))?.showing(config.shown());

    let used_before = !store.list_keys().await?.is_empty();
    // Approval receipts are signed with a key kept beside the database
    // (made before the first API key, so a start that fails later still
    // reads as a first start next time).
    let key = LocalKey::open_or_create(&db.with_extension("signing-key"), used_before).map_err(|error| error.0)?;
    let key = Arc::new(key);
    if !used_before {
        let (secret, id) = issue(&store, Owner::parse("dev")?, Some("first start".into())).await?;
        println!("No API keys yet: issued {id} for owner `dev`:");
        println!("  export AGENT_RUNS_KEY={secret}");
    }

    let (queue, receiver) = InProcessQueue::new();
    let queue: Arc<dyn RunQueue> = Arc::new(queue);
    agent_runs_platform::telemetry::init(&config.traces)?;
    let registry = args.metrics_addr.map(|_| Arc::new(Registry::default()));
    let sink = registry.clone().map(|registry| registry as Arc<dyn MetricsSink>);
    let runs = Measured::wrap(Arc::new(store.clone()), sink.clone());
    if let (Some(addr), Some(registry)) = (args.metrics_addr, &registry) {
        let listener =
            TcpListener::bind(addr).await.map_err(|error| format!("cannot listen on {addr} for metrics: {error}"))?;
        println!("Metrics on http://{}/metrics", listener.local_addr()?);
        tokio::spawn(http_server::serve_metrics(listener, registry.clone()));
    }
    let adapters = Adapters {
        runs,
        keys: Arc::new(store.clone()),
        agents: Arc::new(store.clone()),
        webhooks: Arc::new(store.clone()),
        queue: queue.clone(),
        policies: Arc::new(store.clone()),
    };
    let listener =
        TcpListener::bind(args.addr).await.map_err(|error| format!("cannot listen on {}: {error}", args.addr))?;
    let addr = listener.local_addr()?;
    let issuer = config.issuer.clone().unwrap_or_else(|| crate::http_server::base_url(addr));
    let receipts = Receipts { signer: key.clone(), issuer };
    let services = Services::new(config, adapters, CacheDefaults::LOCAL).with_receipts(receipts).with_signing_keys(key);
    let api = Arc::new(services.api());
    let settings = PoolSettings {
        workers: args.workers.max(1),
        workers_per_owner: args.workers_per_owner.unwrap_or(args.workers.div_ceil(2)),
        sweep_every: Duration::from_millis(args.sweep_ms.max(10)),
    };
    let pool = WorkerPool::start(settings, || services.worker(), receiver, queue, services.sweeper());
    let (stop_deliveries, stopped) = tokio::sync::watch::channel(false);
    let engine = services.webhook_engine(sink);
    let deliveries = OutboxWorker::new(Arc::new(store.clone()), engine);
    let deliveries = tokio::spawn(deliveries.run(stopped));

    println!("Listening on http://{addr} (database {})", store.path().display());
    std::io::stdout().flush()?;
    tracing::info!(%addr, db = %store.path().display(), workers = args.workers, "serving");

    let limits = http_server::ConnectionLimits {
        header_timeout: Duration::from_secs(args.header_timeout_secs),
        body_timeout: Duration::from_secs(args.body_timeout_secs),
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        write_timeout: Duration::from_secs(args.write_timeout_secs),
    };
    http_server::serve(listener, api, limits, shutdown_signal()).await;
    tracing::info!("shutting down: handing running runs back to the queue");
    // A tool call in flight is let finish (up to its timeout) so its outcome
    // is saved; other work is handed back at once.
    pool.shutdown(Duration::from_millis(MIN_WORKER_DEADLINE_MARGIN_MS)).await;
    // Deliveries in flight are cut off: they stay in the outbox and are
    // sent again after the restart.
    let _ = stop_deliveries.send(true);
    let _ = deliveries.await;
    agent_runs_platform::telemetry::shutdown().await;
    Ok(())
}
