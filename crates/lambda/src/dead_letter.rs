use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{LambdaEvent, service_fn};

use crate::aws_services::AwsServices;
use agent_runs_domain::Clock;
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::RunMessage;
use agent_runs_ports::store::{RunStore, StoreError};
use agent_runs_service::worker::abandon_dead_letter;

/// Fails the runs of dead-lettered messages that are still stuck, so no run
/// is left behind; reports transient failures for another try.
pub async fn handle_dead_letters(runs: &dyn RunStore, clock: &dyn Clock, event: SqsEvent) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for record in event.records {
        let id = record.message_id.clone().unwrap_or_default();
        let Some(Ok(message)) = record.body.as_deref().map(serde_json::from_str::<RunMessage>) else {
            // Nothing to fail: the body names no run. Logged, and dropped.
            tracing::error!(message_id = %id, "unreadable dead-lettered message dropped");
            continue;
        };
        match abandon_dead_letter(runs, clock, &message).await {
            Ok(true) => tracing::error!(run_id = %message.run_id, "run failed: its message was dead-lettered"),
            Ok(false) => tracing::info!(run_id = %message.run_id, "dead-lettered message for a run that moved on"),
            // A run that cannot be read is no better on another try: the
            // sweeper logs it for an operator.
            Err(error @ StoreError::Defect(_)) => {
                tracing::error!(run_id = %message.run_id, error = %error_chain(&error), "dead-lettered message for a run that cannot be read");
            }
            Err(error) => {
                tracing::warn!(run_id = %message.run_id, error = %error_chain(&error), "will retry");
                response.add_failure(id);
            }
        }
    }
    response
}

pub async fn run_dead_letter() -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    // The composed store (with its metrics), as every other function writes runs.
    let (store, clock) = (aws.services.adapters.runs.as_ref(), aws.services.clock.as_ref());
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        let deadline = event.context.deadline();
        let response = handle_dead_letters(store, clock, event.payload).await;
        agent_runs_platform::telemetry::flush(Some(deadline)).await;
        Ok::<_, super::Error>(response)
    }))
    .await
}
