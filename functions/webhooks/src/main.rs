//! `webhooks`: every `/v1/webhooks` operation behind API Gateway (they
//! share one permission and one table access, so one function serves them).

use agent_runs_lambda as lambda;
use agent_runs_lambda::Operation;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(Some(Operation::CreateWebhook)).await
}
