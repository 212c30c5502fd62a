//! The port to the work queue: run ids handed to workers.

mod in_process;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use agent_runs_domain::{Owner, RunId};

pub use in_process::{InProcessQueue, QueueReceiver};

/// The body of a queue message: which run to work on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunMessage {
    pub run_id: RunId,
    pub owner: Owner,
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue could not take the message; safe to retry.
    #[error("the queue is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

#[async_trait]
pub trait RunQueue: Send + Sync + 'static {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError>;
}

/// For functions that never send (get, list, cancel): a send is a defect.
pub struct NoQueue;

#[derive(Debug, thiserror::Error)]
#[error("this function has no queue configured (AGENT_RUNS_QUEUE_URL)")]
struct NoQueueConfigured;

#[async_trait]
impl RunQueue for NoQueue {
    async fn enqueue(&self, _message: &RunMessage) -> Result<(), QueueError> {
        Err(QueueError::Unavailable(Box::new(NoQueueConfigured)))
    }
}
