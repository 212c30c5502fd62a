//! The embedded queue: a channel to the in-process worker pool. It is not
//! durable; after a restart the sweeper re-enqueues every stored `queued` run.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc};

use super::{QueueError, RunMessage, RunQueue};

#[derive(Clone)]
pub struct InProcessQueue {
    sender: mpsc::UnboundedSender<RunMessage>,
}

/// The consuming end, shared by the workers of the pool.
#[derive(Clone)]
pub struct QueueReceiver {
    receiver: Arc<Mutex<mpsc::UnboundedReceiver<RunMessage>>>,
}

impl InProcessQueue {
    pub fn new() -> (InProcessQueue, QueueReceiver) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (InProcessQueue { sender }, QueueReceiver { receiver: Arc::new(Mutex::new(receiver)) })
    }
}

impl QueueReceiver {
    /// The next message; `None` once every sender is gone.
    pub async fn receive(&self) -> Option<RunMessage> {
        self.receiver.lock().await.recv().await
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the worker pool has stopped")]
struct PoolStopped;

#[async_trait]
impl RunQueue for InProcessQueue {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError> {
        self.sender.send(message.clone()).map_err(|_| QueueError::Unavailable(Box::new(PoolStopped)))
    }
}
