//! `notifier`: the table's stream of new event items to webhook delivery messages.

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_notifier().await
}
