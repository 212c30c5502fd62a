//! The ports of Agent Runs: what the service asks of persistence (the store
//! traits and the records they keep), of the work queue and of a receipt
//! signer, and the wire form of runs and events (views) that both stores
//! keep ready. Depends on the domain alone: no adapter, no AWS SDK.

pub mod queue;
pub mod receipts;
pub mod store;
pub mod views;

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
pub fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
