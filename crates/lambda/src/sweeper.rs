use lambda_runtime::{LambdaEvent, service_fn};

use crate::aws_services::AwsServices;

/// What a pass leaves of its invocation's time for its last run and the answer.
const SWEEP_DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Invoked on a schedule: one pass over every run whose due time has come.
pub async fn run_sweeper() -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    let sweeper = aws.services.sweeper();
    let (aws, sweeper) = (&aws, &sweeper);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        // Stop in time to answer; the next invocation goes on from there.
        let left = event.context.deadline().duration_since(std::time::SystemTime::now()).unwrap_or_default();
        let invocation_ends = event.context.deadline();
        let deadline = std::time::Instant::now() + left.saturating_sub(SWEEP_DEADLINE_MARGIN);
        // So the JWKS shows the key from a minute after a deploy, not only
        // once a worker first signs (one KMS call per process).
        aws.services.publish_signing_key().await;
        let report = sweeper.sweep_until(Some(deadline)).await;
        agent_runs_platform::telemetry::flush(Some(invocation_ends)).await;
        let report = report?;
        tracing::info!(?report, "sweep done");
        Ok::<_, super::Error>(serde_json::json!({
            "enqueued": report.enqueued,
            "failed": report.failed,
            "skipped": report.skipped,
            "given_back": report.given_back,
            "unfinished": report.unfinished,
        }))
    }))
    .await
}
