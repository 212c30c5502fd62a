//! The embedded server's workers: tasks that take messages from the
//! in-process queue, plus the sweeper on a timer.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{SweepReport, Sweeper, Worker, WorkerError};
use crate::domain::{Owner, RunId};
use crate::error_chain;
use crate::queue::{QueueReceiver, RunMessage, RunQueue};

/// How long a message that hit a transient error first waits before it is
/// tried again; each further failure doubles the wait.
const REDELIVERY_DELAY: Duration = Duration::from_millis(500);
/// Deliveries of one message that may fail before its run is failed, as
/// SQS's `maxReceiveCount` sends it to the dead-letter queue on AWS.
pub const MAX_DELIVERIES: u32 = 5;

pub struct WorkerPool {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

/// How the pool is laid out.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Runs executed at once.
    pub workers: usize,
    /// Of those, the most one owner's runs may hold, so one owner's long
    /// runs cannot take every worker.
    pub workers_per_owner: usize,
    pub sweep_every: Duration,
}

/// The worker slots each owner holds, and its messages that wait for one.
#[derive(Default)]
struct OwnerSlots {
    held: HashMap<Owner, usize>,
    waiting: HashMap<Owner, VecDeque<RunMessage>>,
}

impl OwnerSlots {
    /// Takes a slot for the message's owner, or keeps the message until
    /// one of that owner's slots comes free. `true` when taken.
    fn take(&mut self, message: &RunMessage, limit: usize) -> bool {
        let held = self.held.entry(message.owner.clone()).or_default();
        if *held >= limit {
            self.waiting.entry(message.owner.clone()).or_default().push_back(message.clone());
            return false;
        }
        *held += 1;
        true
    }

    /// The owner's next waiting message, which keeps the slot; or frees it.
    fn give_back(&mut self, owner: &Owner) -> Option<RunMessage> {
        if let Some(waiting) = self.waiting.get_mut(owner) {
            let next = waiting.pop_front();
            if waiting.is_empty() {
                self.waiting.remove(owner);
            }
            if next.is_some() {
                return next;
            }
        }
        if let Some(held) = self.held.get_mut(owner) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(owner);
            }
        }
        None
    }
}

impl WorkerPool {
    /// Starts the workers on `receiver` and the sweeper on a timer.
    pub fn start(
        settings: PoolSettings,
        make_worker: impl Fn() -> Worker,
        receiver: QueueReceiver,
        queue: Arc<dyn RunQueue>,
        sweeper: Sweeper,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let slots = Arc::new(Mutex::new(OwnerSlots::default()));
        let failures: Arc<Mutex<HashMap<RunId, u32>>> = Arc::default();
        let per_owner = settings.workers_per_owner.clamp(1, settings.workers.max(1));
        for _ in 0..settings.workers.max(1) {
            let worker = make_worker();
            let receiver = receiver.clone();
            let (queue, slots, failures) = (queue.clone(), slots.clone(), failures.clone());
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
                    if !crate::lock(&slots).take(&message, per_owner) {
                        continue;
                    }
                    let mut next = Some(message);
                    while let Some(message) = next {
                        deliver(&worker, &message, &stopped, &queue, &failures).await;
                        next = crate::lock(&slots).give_back(&message.owner);
                    }
                }
            });
        }
        let mut stopped = stopped.clone();
        let sweep_every = settings.sweep_every;
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
                    Ok(report) if report != SweepReport::default() => tracing::info!(?report, "sweep"),
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

/// Processes one message. One that hits a transient failure is delivered
/// again after a growing wait, and after [`MAX_DELIVERIES`] its run is
/// failed (what the dead-letter queue does on AWS), so a persistent defect
/// cannot keep a message going round forever.
async fn deliver(
    worker: &Worker,
    message: &RunMessage,
    stopped: &watch::Receiver<bool>,
    queue: &Arc<dyn RunQueue>,
    failures: &Mutex<HashMap<RunId, u32>>,
) {
    let error = match worker.process(message, stopped).await {
        Ok(outcome) => {
            crate::lock(failures).remove(&message.run_id);
            tracing::debug!(run_id = %message.run_id, ?outcome, "message done");
            return;
        }
        Err(WorkerError::Transient(error)) => error,
    };
    let failed = {
        let mut failures = crate::lock(failures);
        let failed = failures.entry(message.run_id).or_default();
        *failed += 1;
        let failed = *failed;
        if failed >= MAX_DELIVERIES {
            failures.remove(&message.run_id);
        }
        failed
    };
    if failed >= MAX_DELIVERIES {
        tracing::error!(run_id = %message.run_id, error = %error_chain(&error), failed, "message kept failing; its run is set aside");
        if let Err(error) = worker.abandon(message).await {
            tracing::error!(run_id = %message.run_id, error = %error_chain(&error), "could not fail a run whose message kept failing; the sweeper will retry");
        }
        return;
    }
    let delay = REDELIVERY_DELAY.saturating_mul(1 << (failed - 1));
    tracing::warn!(run_id = %message.run_id, error = %error_chain(&error), failed, ?delay, "transient failure; redelivering");
    let (queue, message) = (queue.clone(), message.clone());
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        // If this fails too, the sweeper finds the run.
        let _ = queue.enqueue(&message).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(owner: &str, n: u128) -> RunMessage {
        RunMessage { run_id: RunId::from_ulid(ulid::Ulid::from_parts(1, n)), owner: Owner::parse(owner).unwrap() }
    }

    #[test]
    fn an_owner_holds_at_most_its_share_of_workers_and_its_waiting_runs_keep_the_slot() {
        let mut slots = OwnerSlots::default();
        let (a1, a2, a3, b1) = (message("a", 1), message("a", 2), message("a", 3), message("b", 4));
        assert!(slots.take(&a1, 2) && slots.take(&a2, 2));
        assert!(!slots.take(&a3, 2), "a third run of `a` waits");
        assert!(slots.take(&b1, 2), "another owner is not held up");
        assert_eq!(slots.give_back(&a1.owner), Some(a3.clone()), "the waiting run takes the freed slot");
        assert_eq!(slots.give_back(&a1.owner), None);
        assert_eq!(slots.give_back(&a1.owner), None);
        assert!(slots.held.get(&a1.owner).is_none() && slots.waiting.is_empty());
        assert!(slots.take(&a1, 2) && slots.take(&a2, 2));
    }
}
