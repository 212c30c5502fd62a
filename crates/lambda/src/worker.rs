use std::time::Duration;

use agent_runs_ports::error_chain;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use futures_util::future::join_all;
use lambda_runtime::{LambdaEvent, service_fn};
use tokio::sync::watch;

use crate::aws_services::AwsServices;
use agent_runs_ports::queue::{RunMessage, RunQueue};
use agent_runs_service::worker::{Interrupted, Outcome, Worker};

/// Works through one SQS batch, all its messages at once. A message that
/// cannot be parsed or hits a transient failure is reported, so SQS
/// delivers it again (and, after maxReceiveCount, to the dead-letter
/// queue); one whose run is done, awaiting or held elsewhere is
/// acknowledged. Runs handed back at `stop` are enqueued afresh.
pub async fn handle_batch(
    worker: &Worker,
    queue: &dyn RunQueue,
    event: SqsEvent,
    stop: &watch::Receiver<bool>,
) -> SqsBatchResponse {
    let results = join_all(event.records.into_iter().map(|record| async move {
        let id = record.message_id.clone().unwrap_or_default();
        let message: RunMessage = match record.body.as_deref().map(serde_json::from_str) {
            Some(Ok(message)) => message,
            _ => {
                tracing::error!(message_id = %id, "unreadable message");
                return Err(id);
            }
        };
        match worker.process(&message, stop).await {
            Ok(Outcome::Released) => queue.enqueue(&message).await.map_err(|error| {
                tracing::warn!(run_id = %message.run_id, error = %error_chain(&error), "could not re-enqueue a handed-back run");
                id
            }),
            Ok(outcome) => {
                tracing::info!(run_id = %message.run_id, ?outcome, "message done");
                Ok(())
            }
            Err(Interrupted { error, .. }) => {
                tracing::warn!(run_id = %message.run_id, error = %error_chain(&error), "transient failure; SQS will redeliver");
                Err(id)
            }
        }
    }))
    .await;
    let mut response = SqsBatchResponse::default();
    for failed in results.into_iter().filter_map(Result::err) {
        response.add_failure(failed);
    }
    response
}

pub async fn run_worker() -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    aws.warm_up();
    let worker = aws.services.worker();
    let queue = aws.services.adapters.queue.clone();
    let margin = aws.services.config.worker_deadline_margin;
    let (worker, queue) = (&worker, queue.as_ref());
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        // Hand runs back before the invocation's deadline rather than be cut off.
        let (stop_sender, stop) = watch::channel(false);
        let deadline = event.context.deadline();
        let left = deadline.duration_since(std::time::SystemTime::now()).unwrap_or_default();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(left.saturating_sub(margin).max(Duration::from_millis(100))).await;
            let _ = stop_sender.send(true);
        });
        let response = handle_batch(worker, queue, event.payload, &stop).await;
        timer.abort();
        agent_runs_platform::telemetry::flush(Some(deadline)).await;
        Ok::<_, super::Error>(response)
    }))
    .await
}
