//! `deliver`: sends webhook deliveries from their SQS queue.

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_deliver().await
}
