//! The Lambda entry points: API Gateway (HTTP API, payload 2.0) requests
//! to the shared operations, SQS batches to the worker, and the scheduled
//! sweeper, and the webhook notifier (the table's stream) and deliverer
//! (their SQS queue). Each function's `main` calls one `run_*` here.

mod aws_services;
mod dead_letter;
mod http;
mod sweeper;
mod webhooks;
mod worker;

pub use agent_runs_service::api::Operation;
pub use aws_services::{AwsServices, SetupError};
pub use dead_letter::{handle_dead_letters, run_dead_letter};
pub use http::{from_api_response, into_api_request, run_http};
pub use sweeper::run_sweeper;
pub use webhooks::{handle_deliveries, handle_stream, run_deliver, run_notifier};
pub use worker::{handle_batch, run_worker};

pub type Error = lambda_runtime::Error;

/// Logs as JSON lines for CloudWatch, the level from `AGENT_RUNS_LOG`
/// (default `info`), and no ANSI colours.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("AGENT_RUNS_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .with_current_span(false)
        .try_init();
}
