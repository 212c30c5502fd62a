//! The embedded server's workers: tasks that take messages from the
//! in-process queue, plus the sweeper on a timer.

use crate::error_chain;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Sweeper, Worker, WorkerError};
use crate::queue::{QueueReceiver, RunQueue};

/// How long a message that hit a transient error waits before it is tried again.
const REDELIVERY_DELAY: Duration = Duration::from_millis(500);

pub struct WorkerPool {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl WorkerPool {
    /// Starts `size` workers on `receiver` and the sweeper every `sweep_every`.
    pub fn start(
        size: usize,
        make_worker: impl Fn() -> Worker,
        receiver: QueueReceiver,
        queue: Arc<dyn RunQueue>,
        sweeper: Sweeper,
        sweep_every: Duration,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for _ in 0..size {
            let worker = make_worker();
            let receiver = receiver.clone();
            let queue = queue.clone();
            let mut stopped = stopped.clone();
            tasks.spawn(async move {
                loop {
                    let message = tokio::select! {
                        biased;
                        _ = stopped.wait_for(|stop| *stop) => return,
                        message = receiver.receive() => match message {
                            Some(message) => message,
                            None => return,
                        },
                    };
                    match worker.process(&message, &stopped).await {
                        Ok(outcome) => tracing::debug!(run_id = %message.run_id, ?outcome, "message done"),
                        Err(WorkerError::Transient(error)) => {
                            tracing::warn!(run_id = %message.run_id, error = %error_chain(&error), "transient failure; redelivering");
                            let queue = queue.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(REDELIVERY_DELAY).await;
                                // If this fails too, the sweeper finds the run.
                                let _ = queue.enqueue(&message).await;
                            });
                        }
                    }
                }
            });
        }
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            match sweeper.enqueue_all_queued().await {
                Ok(count) if count > 0 => tracing::info!(count, "re-enqueued queued runs found at start-up"),
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "start-up recovery failed; the sweeper will retry")
                }
            }
            let mut ticks = tokio::time::interval(sweep_every);
            loop {
                tokio::select! {
                    biased;
                    _ = stopped.wait_for(|stop| *stop) => return,
                    _ = ticks.tick() => {}
                }
                match sweeper.sweep().await {
                    Ok(report) if report.enqueued + report.failed > 0 => tracing::info!(?report, "sweep"),
                    Ok(_) => {}
                    Err(error) => tracing::warn!(error = %error_chain(&error), "sweep failed"),
                }
            }
        });
        WorkerPool { stop, tasks }
    }

    /// Asks every worker to hand its run back at the next step, and waits
    /// for them up to `grace`.
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(grace, async { while self.tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!("workers did not stop in time; their runs are taken over after the lease expires");
            self.tasks.abort_all();
        }
    }
}
