//! `policies`: every `/v1/policies` operation behind API Gateway (the
//! owner's approval policy, and rules tried on its history).

use agent_runs_lambda as lambda;
use agent_runs_lambda::Operation;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::GetPolicy)).await
}
