//! The Agent Runs service, everything but the entry points: the pure domain,
//! the HTTP operations, authentication, the store and queue ports with their
//! adapters, the worker and the agents.

pub mod agents;
pub mod api;
pub mod auth;
pub mod aws;
pub mod config;
pub mod domain;
pub mod lambda;
pub mod queue;
pub mod store;
pub mod worker;
