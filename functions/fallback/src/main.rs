//! `fallback`: API Gateway's `$default` route. Answers unknown paths with
//! `404` and known paths with another method with `405` and `Allow`, in the
//! contract's error format (after authentication, like every route).

use agent_runs_lambda as lambda;

#[tokio::main]
async fn main() -> Result<(), lambda::Error> {
    lambda::run_http(None).await
}
