//! `dead-letter`: fails the runs whose messages reached the dead-letter queue.

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_dead_letter().await
}
