//! `sweeper`: on a schedule, re-enqueues lost runs and recovers expired leases.

use agent_runs_shared::lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_sweeper().await
}
