//! `directory`: `GET /v1/keys` and `GET /v1/agents/{agent}` behind API
//! Gateway (the owner's keys by name, an agent's settings a client shows).

use agent_runs_shared::api::Operation;
use agent_runs_shared::lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::ListKeys)).await
}
