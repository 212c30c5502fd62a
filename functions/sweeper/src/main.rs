//! `sweeper`: on a schedule, re-enqueues lost runs and recovers expired leases.

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_sweeper().await
}
