//! The embedded server's workers: tasks that take messages from the
//! in-process queue, plus the sweeper on a timer.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use super::{Outcome, SweepReport, Sweeper, Worker};
use agent_runs_domain::{Owner, RunId};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{QueueReceiver, RunMessage, RunQueue};

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

/// Messages waiting for a worker, by owner, and the slots each owner
/// holds. Owners with a free slot take turns, so neither a busy owner nor
/// two of them can keep the others' runs waiting.
#[derive(Default)]
struct Dispatch {
    held: HashMap<Owner, usize>,
    waiting: HashMap<Owner, VecDeque<RunMessage>>,
    /// Owners with waiting messages, in the order they are served next.
    turns: VecDeque<Owner>,
}

impl Dispatch {
    fn push(&mut self, message: RunMessage) {
        let waiting = self.waiting.entry(message.owner.clone()).or_default();
        if waiting.is_empty() {
            self.turns.push_back(message.owner.clone());
        }
        waiting.push_back(message);
    }

    /// The next message of the next owner with a free slot, which takes
    /// the slot until [`Dispatch::give_back`].
    fn next(&mut self, per_owner: usize) -> Option<RunMessage> {
        for _ in 0..self.turns.len() {
            let owner = self.turns.pop_front()?;
            if self.held.get(&owner).is_some_and(|held| *held >= per_owner) {
                self.turns.push_back(owner);
                continue;
            }
            let Some(waiting) = self.waiting.get_mut(&owner) else { continue };
            let Some(message) = waiting.pop_front() else { continue };
            if waiting.is_empty() {
                self.waiting.remove(&owner);
            } else {
                self.turns.push_back(owner.clone());
            }
            *self.held.entry(owner).or_default() += 1;
            return Some(message);
        }
        None
    }

    fn give_back(&mut self, owner: &Owner) {
        if let Some(held) = self.held.get_mut(owner) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(owner);
            }
        }
    }
}

/// Deliveries in a row of one run that failed without getting further.
struct Failures {
    count: u32,
    last: Instant,
}

/// A run's failure count is forgotten after this long without a failure.
const FORGET_FAILURES_AFTER: Duration = Duration::from_secs(3600);

struct Shared {
    dispatch: Mutex<Dispatch>,
    /// Woken when a message arrives or a slot comes free.
    ready: Notify,
    failures: Mutex<HashMap<RunId, Failures>>,
    queue: Arc<dyn RunQueue>,
    per_owner: usize,
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
        let shared = Arc::new(Shared {
            dispatch: Mutex::default(),
            ready: Notify::new(),
            failures: Mutex::default(),
            queue,
            per_owner: settings.workers_per_owner.clamp(1, settings.workers.max(1)),
        });
        let (dispatching, mut until_stopped) = (shared.clone(), stopped.clone());
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = until_stopped.wait_for(|stop| *stop) => return,
                    message = receiver.receive() => match message {
                        Some(message) => {
                            agent_runs_ports::lock(&dispatching.dispatch).push(message);
                            dispatching.ready.notify_one();
                        }
                        None => return,
                    },
                }
            }
        });
        for _ in 0..settings.workers.max(1) {
            tasks.spawn(work(make_worker(), shared.clone(), stopped.clone()));
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
    /// for them up to `grace`. Messages not yet taken stay behind: their
    /// runs are `queued` in the store, and are enqueued again at start-up.
    pub async fn shutdown(mut self, grace: Duration) {
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(grace, async { while self.tasks.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            tracing::warn!("workers did not stop in time; their runs are taken over after the lease expires");
            self.tasks.abort_all();
        }
    }
}

/// One worker: takes the next message whose owner has a slot free and
/// delivers it, until stopped.
async fn work(worker: Worker, shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    loop {
        let message = loop {
            if *stopped.borrow() {
                return;
            }
            if let Some(message) = agent_runs_ports::lock(&shared.dispatch).next(shared.per_owner) {
                break message;
            }
            tokio::select! {
                biased;
                _ = stopped.wait_for(|stop| *stop) => return,
                () = shared.ready.notified() => {}
            }
        };
        // More may be ready: pass the wake-up on.
        shared.ready.notify_one();
        let delivered = AssertUnwindSafe(deliver(&worker, &message, &stopped, &shared)).catch_unwind().await;
        if delivered.is_err() {
            tracing::error!(run_id = %message.run_id, "a step panicked; the run is taken over when its lease expires");
        }
        agent_runs_ports::lock(&shared.dispatch).give_back(&message.owner);
        shared.ready.notify_one();
    }
}

/// Processes one message. One that fails without getting further is
/// delivered again after a growing wait, and after [`MAX_DELIVERIES`] such
/// failures in a row its run is failed (what the dead-letter queue does on
/// AWS), so a persistent defect cannot keep a message going round forever.
async fn deliver(worker: &Worker, message: &RunMessage, stopped: &watch::Receiver<bool>, shared: &Shared) {
    let interrupted = match worker.process(message, stopped).await {
        Ok(outcome) => {
            // A dropped message says nothing of the run's health.
            if outcome != Outcome::Dropped {
                agent_runs_ports::lock(&shared.failures).remove(&message.run_id);
            }
            tracing::debug!(run_id = %message.run_id, ?outcome, "message done");
            return;
        }
        Err(interrupted) => interrupted,
    };
    let failed = {
        let mut failures = agent_runs_ports::lock(&shared.failures);
        let now = Instant::now();
        failures.retain(|_, failures| now.duration_since(failures.last) < FORGET_FAILURES_AFTER);
        let failures = failures.entry(message.run_id).or_insert(Failures { count: 0, last: now });
        failures.count = if interrupted.progressed { 1 } else { failures.count + 1 };
        failures.last = now;
        failures.count
    };
    let error = &interrupted.error;
    if failed >= MAX_DELIVERIES {
        agent_runs_ports::lock(&shared.failures).remove(&message.run_id);
        tracing::error!(run_id = %message.run_id, error = %error_chain(error), failed, "message kept failing; its run is set aside");
        if let Err(error) = worker.abandon(message).await {
            tracing::error!(run_id = %message.run_id, error = %error_chain(&error), "could not fail a run whose message kept failing; the sweeper will retry");
        }
        return;
    }
    let delay = REDELIVERY_DELAY.saturating_mul(1 << (failed - 1));
    tracing::warn!(run_id = %message.run_id, error = %error_chain(error), failed, ?delay, "transient failure; redelivering");
    let (queue, message) = (shared.queue.clone(), message.clone());
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
    fn an_owner_holds_at_most_its_share_of_workers_and_the_others_are_not_held_up() {
        let mut dispatch = Dispatch::default();
        let (a1, a2, a3, b1) = (message("a", 1), message("a", 2), message("a", 3), message("b", 4));
        for message in [&a1, &a2, &a3, &b1] {
            dispatch.push(message.clone());
        }
        assert_eq!(dispatch.next(2), Some(a1.clone()));
        assert_eq!(dispatch.next(2), Some(b1.clone()), "owners take turns");
        assert_eq!(dispatch.next(2), Some(a2.clone()));
        assert_eq!(dispatch.next(2), None, "a third run of `a` waits for one of its slots");
        dispatch.give_back(&b1.owner);
        assert_eq!(dispatch.next(2), None, "another owner's free slot is not `a`'s");
        dispatch.give_back(&a1.owner);
        assert_eq!(dispatch.next(2), Some(a3.clone()));
        dispatch.give_back(&a1.owner);
        dispatch.give_back(&a1.owner);
        assert!(dispatch.held.is_empty() && dispatch.waiting.is_empty() && dispatch.turns.is_empty());
    }

    #[test]
    fn two_busy_owners_cannot_keep_a_third_waiting() {
        // Four workers, two per owner: `a` and `b` hold them all, with more waiting.
        let mut dispatch = Dispatch::default();
        for n in 0..10 {
            dispatch.push(message("a", n));
            dispatch.push(message("b", 100 + n));
        }
        let taken: Vec<_> = (0..4).map_while(|_| dispatch.next(2)).collect();
        assert_eq!(taken.len(), 4);
        let c = message("c", 1000);
        dispatch.push(c.clone());
        // Workers come free one by one, each from the owner it served.
        let mut served = Vec::new();
        for freed in ["a", "b", "a", "b"] {
            dispatch.give_back(&Owner::parse(freed).unwrap());
            served.push(dispatch.next(2).unwrap());
        }
        assert!(served[..3].contains(&c), "`c` waits at most for each busy owner's turn: {served:?}");
    }
}
