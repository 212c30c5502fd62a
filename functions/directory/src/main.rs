//! `directory`: `GET /v1/keys` and `GET /v1/agents/{agent}` behind API
//! Gateway (the owner's keys by name, an agent's settings a client shows).

use agent_runs_lambda as lambda;
use agent_runs_lambda::Operation;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::ListKeys)).await
}
