//! The Agent Runs service over its ports: the HTTP operations, the run
//! commands, authentication, configuration, the worker, webhooks and
//! metrics, and the composition that joins them ([`services::Services`]).
//! Which adapters fill the ports is the entry point's choice: the embedded
//! server's (`agent_runs_embedded`) or the Lambda functions' (`agent_runs_aws`).

pub mod api;
pub mod auth;
pub mod commands;
pub mod config;
pub mod metrics;
pub mod services;
pub mod webhooks;
pub mod worker;
