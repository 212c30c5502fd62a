//! Webhooks on AWS: the notifier turns each new event item of the table's
//! stream into one delivery message per endpoint that wants it; the
//! deliver function sends them, records every attempt, and queues a failed
//! one's next attempt as a new message due at its time.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event as StreamEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use futures_util::future::join_all;
use lambda_runtime::{LambdaEvent, service_fn};

use async_trait::async_trait;

use crate::aws_services::AwsServices;
use agent_runs_aws::{DeliveryMessage, WebhookQueue};
use agent_runs_aws::{DynamoStore, decode_stream_event};
use agent_runs_domain::{Clock, Owner, Timestamp, WebhookEndpoint, WebhookStatus};
use agent_runs_ports::error_chain;
use agent_runs_ports::store::{Delivery, EventLog, StoreError, WebhookStore};
use agent_runs_service::metrics::{EmfSink, MetricsSink};
use agent_runs_service::webhooks::{AttemptResult, DeliveryError, DeliveryQueue, EARLY_ENOUGH, Held, WebhookEngine};

/// Queues the deliveries of a batch of stream records, in order. At the
/// first record that cannot be queued it stops and reports that record,
/// so Lambda retries from it (records before it are done; a record is
/// never skipped, and one retried may be delivered twice: at least once).
pub async fn handle_stream(store: &DynamoStore, queue: &WebhookQueue, event: StreamEvent) -> DynamoDbEventResponse {
    let mut endpoints: HashMap<Owner, Vec<WebhookEndpoint>> = HashMap::new();
    let mut response = DynamoDbEventResponse::default();
    for record in event.records {
        if record.event_name != "INSERT" {
            continue;
        }
        let image = record.change.new_image.clone().into();
        let (owner, run_id, event) = match decode_stream_event(&image) {
            None => continue,
            Some(Ok(decoded)) => decoded,
            Some(Err(error)) => {
                // Not an event the service can read: retrying will not help.
                tracing::error!(error = %error_chain(&error), "an event item of the stream cannot be read; no webhook for it");
                continue;
            }
        };
        let queued = async {
            let owners = match endpoints.entry(owner.clone()) {
                Entry::Occupied(found) => found.into_mut(),
                Entry::Vacant(empty) => empty.insert(store.owner_webhooks(&owner).await?),
            };
            let messages: Vec<DeliveryMessage> = owners
                .iter()
                .filter(|endpoint| endpoint.status == WebhookStatus::Enabled && endpoint.events.wants(&event.kind))
                .map(|endpoint| DeliveryMessage {
                    owner: owner.clone(),
                    webhook_id: endpoint.id,
                    run_id,
                    seq: event.seq,
                    attempts: 0,
                    not_before: None,
                })
                .collect();
            queue.send(&messages).await.map_err(|error| StoreError::Unavailable(Box::new(error)))
        };
        if let Err(error) = queued.await {
            tracing::warn!(error = %error_chain(&error), %run_id, seq = event.seq, "cannot queue webhook deliveries; retrying from this record");
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = record.change.sequence_number.clone();
            response.batch_item_failures.push(failure);
            break;
        }
    }
    response
}

/// How long a message whose delivery could not be attempted (a failed
/// read or record) is hidden: growing with its receives, so an outage of
/// hours passes before SQS's 20 receives send it to the dead-letter queue.
fn backoff(record: &SqsMessage) -> Duration {
    let receives: u32 =
        record.attributes.get("ApproximateReceiveCount").and_then(|count| count.parse().ok()).unwrap_or(1);
    (Duration::from_secs(30) * 2u32.saturating_pow(receives.saturating_sub(1).min(10)))
        .min(Duration::from_secs(15 * 60))
}

/// The delivery queue in SQS as the engine's queue: a delivery's place is
/// the id of the message it came in. A failed attempt's next one is a
/// message of its own, due at its time.
struct SqsDeliveries<'a> {
    store: &'a DynamoStore,
    queue: &'a WebhookQueue,
    clock: &'a dyn Clock,
}

/// The message that carries `delivery` on, after `attempts`, not before
/// `not_before`: what a received message said, read back from the delivery
/// it became (its endpoint and event were read by the message's keys).
fn message_for(delivery: &Delivery<String>, attempts: u32, not_before: Timestamp) -> DeliveryMessage {
    DeliveryMessage {
        owner: delivery.endpoint.owner.clone(),
        webhook_id: delivery.endpoint.id,
        run_id: delivery.run_id,
        seq: delivery.event.seq,
        attempts,
        not_before: Some(not_before),
    }
}

#[async_trait]
impl DeliveryQueue for SqsDeliveries<'_> {
    type Place = String;

    async fn finish(&self, delivery: &Delivery<String>, result: &AttemptResult) -> Result<(), DeliveryError> {
        // Made but not recorded (a 410 would not disable the endpoint):
        // made again later rather than lost.
        self.store
            .record_attempt(&delivery.endpoint.owner, &result.attempt, result.health)
            .await
            .map_err(DeliveryError::Record)?;
        let Some(retry_at) = result.retry_at else {
            return Ok(());
        };
        let next = message_for(delivery, result.attempt.attempt, retry_at);
        // Claimed first (by this message's id), so that two messages for
        // the same attempt (the notifier re-queueing a record, a send whose
        // answer was lost) go on as one series. Two receipts of the very
        // same message share its id: each may queue the next attempt once,
        // and the claim of that next attempt makes them one series again.
        let claimed = self
            .store
            .claim_retry(next.webhook_id, next.run_id, next.seq, next.attempts, &delivery.place)
            .await
            .map_err(DeliveryError::Claim)?;
        if claimed {
            // Should this fail, the message is received again, makes its
            // attempt again and, holding the claim, queues the next one.
            self.queue.send_later(&next, retry_at.since(self.clock.now())).await.map_err(DeliveryError::Queue)?;
        }
        Ok(())
    }

    /// As a message of its own that comes back to look again: nothing
    /// wakes a message when the run moves on.
    async fn hold(&self, delivery: &Delivery<String>, held: Held) -> Result<(), DeliveryError> {
        let message = message_for(delivery, delivery.attempts, held.look_again);
        self.queue.send_later(&message, held.look_again.since(self.clock.now())).await.map_err(DeliveryError::Queue)
    }
}

/// Takes the steps of a batch of delivery messages, all at once. A message
/// is acknowledged when its delivery is done (delivered, given up, its
/// endpoint or event gone), held or its next attempt queued as a message of
/// its own; one that is not due yet is sent on, delayed; one that could not
/// be attempted or recorded is hidden for a while and reported, so SQS
/// keeps it.
pub async fn handle_deliveries(
    engine: &WebhookEngine,
    store: &DynamoStore,
    queue: &WebhookQueue,
    event: SqsEvent,
) -> SqsBatchResponse {
    let clock = engine.clock();
    let deliveries = &SqsDeliveries { store, queue, clock };
    let results = join_all(event.records.into_iter().map(|record| async move {
        let id = record.message_id.clone().unwrap_or_default();
        let keep = |delay: Duration| {
            let (receipt, id) = (record.receipt_handle.clone().unwrap_or_default(), id.clone());
            async move {
                if let Err(error) = queue.hide(&receipt, delay).await {
                    tracing::warn!(error = %error_chain(&error), "cannot hide a delivery message; the queue's visibility timeout applies");
                }
                Err(id)
            }
        };
        let Some(message) = record.body.as_deref().and_then(|body| serde_json::from_str::<DeliveryMessage>(body).ok())
        else {
            tracing::error!(message_id = %id, "unreadable delivery message");
            return Err(id);
        };
        let now = clock.now();
        if let Some(not_before) = message.not_before.filter(|not_before| *not_before > now.plus(EARLY_ENOUGH)) {
            // Not due yet: a new message, delayed, stands in for this one.
            return match queue.send_later(&message, not_before.since(now)).await {
                Ok(()) => Ok(()),
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "cannot send a waiting delivery on; trying later");
                    keep(backoff(&record)).await
                }
            };
        }
        let read = async {
            let endpoint = store.get_webhook(&message.owner, message.webhook_id).await?;
            let event = store.event(message.run_id, message.seq).await?;
            Ok::<_, StoreError>((endpoint, event))
        };
        let (endpoint, event) = match read.await {
            Ok((Some(endpoint), Some(event))) if endpoint.status == WebhookStatus::Enabled => (endpoint, event),
            // Deleted or disabled endpoint, or an event undone with its run.
            Ok(_) => return Ok(()),
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "cannot read a delivery's endpoint or event; trying later");
                return keep(backoff(&record)).await;
            }
        };
        let (run_id, attempts) = (message.run_id, message.attempts);
        let delivery = Delivery { place: id.clone(), endpoint, run_id, event, attempts };
        match engine.deliver(deliveries, &delivery).await {
            Ok(_) => Ok(()),
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), webhook_id = %delivery.endpoint.id, "a webhook delivery is kept; trying later");
                keep(backoff(&record)).await
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

fn webhook_queue(aws: &AwsServices) -> Result<WebhookQueue, super::Error> {
    aws.webhook_queue.clone().ok_or_else(|| "AGENT_RUNS_WEBHOOK_QUEUE_URL is not set".into())
}

pub async fn run_notifier() -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    aws.warm_up();
    let queue = webhook_queue(&aws)?;
    let (store, queue) = (&aws.store, &queue);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<StreamEvent>| async move {
        Ok::<_, super::Error>(handle_stream(store, queue, event.payload).await)
    }))
    .await
}

pub async fn run_deliver() -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    aws.warm_up();
    let queue = webhook_queue(&aws)?;
    let metrics: Option<Arc<dyn MetricsSink>> = aws.services.config.emf_metrics.then(|| Arc::new(EmfSink) as _);
    let engine = aws.services.webhook_engine(metrics);
    let (engine, store, queue) = (&engine, &aws.store, &queue);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        Ok::<_, super::Error>(handle_deliveries(engine, store, queue, event.payload).await)
    }))
    .await
}
