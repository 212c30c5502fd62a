//! `decide-batch`: one operation of the API behind API Gateway.

use agent_runs_shared::api::Operation;
use agent_runs_shared::lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::DecideBatch)).await
}
