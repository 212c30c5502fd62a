//! What the tests use and the service never ships: fault injection for the
//! store, the queue and the AWS SDK calls, and a capacity model of
//! DynamoDB's limits (`faults`); what tests ask of a store beyond its
//! ports (`stores`); an MCP server made with the official Python SDK
//! (`mcp_server`); what DynamoDB would bill for a client's calls (`units`).

pub mod faults;
pub mod mcp_server;
pub mod stores;
pub mod units;

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
