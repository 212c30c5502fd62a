//! What every process of Agent Runs sets up around its work, below the
//! adapters and the agents that use it: traces (OpenTelemetry) and the AWS
//! SDK's configuration with its TLS client.

pub mod aws_sdk;
pub mod telemetry;
