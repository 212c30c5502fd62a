//! What the tests use and the service never ships: fault injection for the
//! store, the queue and the AWS SDK calls, and a capacity model of
//! DynamoDB's limits (`faults`); what tests ask of a store beyond its
//! ports (`stores`); an MCP server made with the official Python SDK
//! (`mcp_server`); what DynamoDB would bill for a client's calls (`units`);
//! a stand-in for a model provider and the tools an agent calls (`stand_in`);
//! a typical approval to build test cases from (`approvals`).

pub mod approvals;
pub mod faults;
pub mod mcp_server;
pub mod stand_in;
pub mod stores;
pub mod units;

use agent_runs_ports::lock;
