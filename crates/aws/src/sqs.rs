//! The production queue: an SQS standard queue; the message body is the
//! JSON of [`RunMessage`].

use async_trait::async_trait;
use aws_sdk_sqs::Client;

use agent_runs_ports::queue::{QueueError, RunMessage, RunQueue};

#[derive(Clone)]
pub struct SqsQueue {
    client: Client,
    queue_url: String,
}

impl SqsQueue {
    pub fn new(client: Client, queue_url: impl Into<String>) -> Self {
        Self { client, queue_url: queue_url.into() }
    }
}

#[async_trait]
impl RunQueue for SqsQueue {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError> {
        let body = serde_json::to_string(message).map_err(|error| QueueError::Unavailable(Box::new(error)))?;
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .send()
            .await
            .map_err(|error| QueueError::Unavailable(Box::new(error)))?;
        Ok(())
    }
}

impl SqsQueue {
    /// A cheap read that opens the connection to SQS.
    pub async fn warm_up(&self) {
        let _ = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
            .send()
            .await;
    }
}
