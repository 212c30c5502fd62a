use lambda_runtime::{LambdaEvent, service_fn};

use crate::aws::AwsServices;

/// Invoked on a schedule: one pass over every run whose due time has come.
pub async fn run_sweeper() -> Result<(), super::Error> {
    super::init_logging();
    let services = AwsServices::from_env().await?;
    let sweeper = services.sweeper();
    let sweeper = &sweeper;
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        let report = sweeper.sweep().await?;
        tracing::info!(enqueued = report.enqueued, failed = report.failed, "sweep done");
        Ok::<_, super::Error>(serde_json::json!({"enqueued": report.enqueued, "failed": report.failed}))
    }))
    .await
}
