//! The AWS path's queue of webhook deliveries: one SQS message per
//! endpoint and event, naming them (the deliver function reads both, so a
//! message stays small whatever the event holds), with the attempts made
//! so far. A failed attempt's next one is a new message, due at its time:
//! delayed by SQS up to 15 minutes, and sent on again, delayed, while not
//! yet due, so a waiting delivery is never held in flight (SQS allows a
//! queue about 120,000 messages in flight).
//! Messages are grouped by endpoint (`MessageGroupId` on a standard queue:
//! SQS fair queues), so a slow endpoint's backlog of messages in flight
//! does not delay the others'.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use serde::{Deserialize, Serialize};

use agent_runs_domain::{Owner, RunId, Timestamp, WebhookId};
use agent_runs_ports::queue::QueueError;

/// Hides are short (a failed read's backoff); SQS allows 12 hours.
const MAX_HIDE: Duration = Duration::from_secs(12 * 60 * 60 - 5 * 60);
/// SQS delays a new message by at most 15 minutes.
const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// Entries of one SendMessageBatch.
const BATCH: usize = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    pub owner: Owner,
    pub webhook_id: WebhookId,
    pub run_id: RunId,
    pub seq: u64,
    /// Attempts made so far.
    #[serde(default)]
    pub attempts: u32,
    /// Not to be attempted before then (a retry's time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
}

#[derive(Clone)]
pub struct WebhookQueue {
    client: Client,
    queue_url: String,
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> QueueError {
    QueueError::Unavailable(Box::new(error))
}

impl WebhookQueue {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }

    /// Sends every message, or fails (some may have been sent: a delivery
    /// is at least once).
    pub async fn send(&self, messages: &[DeliveryMessage]) -> Result<(), QueueError> {
        for chunk in messages.chunks(BATCH) {
            let mut entries = Vec::with_capacity(chunk.len());
            for (index, message) in chunk.iter().enumerate() {
                let body = serde_json::to_string(message).map_err(unavailable)?;
                entries.push(
                    SendMessageBatchRequestEntry::builder()
                        .id(index.to_string())
                        .message_body(body)
                        .message_group_id(message.webhook_id.to_string())
                        .build()
                        .map_err(unavailable)?,
                );
            }
            let output = self
                .client
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(unavailable)?;
            if let Some(failed) = output.failed.first() {
                return Err(QueueError::Unavailable(format!("SQS refused a delivery message: {}", failed.code).into()));
            }
        }
        Ok(())
    }

    /// Sends `message` to be received after `delay` (or 15 minutes, the
    /// most SQS delays; its `not_before` says how much longer it waits).
    pub async fn send_later(&self, message: &DeliveryMessage, delay: Duration) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).map_err(unavailable)?;
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_group_id(message.webhook_id.to_string())
            // Rounded up: never received before its time.
            .delay_seconds(delay.min(MAX_DELAY).as_millis().div_ceil(1_000) as i32)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Hides a received message for `delay` (at most about 12 hours), so it
    /// is received again then.
    pub async fn hide(&self, receipt_handle: &str, delay: Duration) -> Result<(), QueueError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(delay.min(MAX_HIDE).as_secs().max(1) as i32)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
