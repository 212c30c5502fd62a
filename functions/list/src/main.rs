//! `list`: one operation of the API behind API Gateway.

use agent_runs_lambda as lambda;
use agent_runs_lambda::Operation;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::List)).await
}
