//! `worker`: executes runs from SQS batches, reporting partial failures.

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_worker().await
}
