//! The Agent Runs service, everything but the entry points: the pure domain,
//! its wire form (views), the HTTP operations, authentication, the store and queue ports with their
//! adapters, the worker and the agents.

pub mod agents;
pub mod api;
pub mod auth;
pub mod aws;
#[cfg(feature = "aws-setup")]
pub mod aws_setup;
pub mod config;
pub use agent_runs_domain as domain;
pub mod lambda;
pub mod lifecycle;
pub mod metrics;
pub mod public_network;
pub mod queue;
pub mod receipts;
pub mod sdk;
pub mod services;
pub mod store;
pub mod telemetry;
pub mod views;
pub mod webhooks;
pub mod worker;

/// An error and all its causes, for logs (never for clients).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Locks a mutex whose data stays valid even if a holder panicked (caches,
/// counters): a panic elsewhere must not take every later request down.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
