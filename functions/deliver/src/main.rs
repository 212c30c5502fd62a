//! `deliver`: sends webhook deliveries from their SQS queue.

use agent_runs_shared::lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_deliver().await
}
