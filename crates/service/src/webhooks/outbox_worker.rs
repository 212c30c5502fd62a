//! The embedded server's deliveries: a task that takes what is due from
//! the outbox, sends it, and records each attempt with the delivery's next
//! step in one transaction. A delivery leaves the outbox only in the
//! transaction that records it delivered (or given up), so a crash at any
//! point means it is sent again after the restart: at least once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use async_trait::async_trait;

use super::{AttemptResult, Delivered, DeliveryError, DeliveryQueue, Held, WebhookEngine};
use agent_runs_domain::{Owner, WebhookId};
use agent_runs_ports::error_chain;
use agent_runs_ports::store::{Delivery, DueSkip, Outbox, PendingDelivery};

/// How long the worker sleeps when nothing is due and no commit woke it:
/// the latest a retry falls due is this much after its time.
const IDLE_POLL: Duration = Duration::from_millis(500);
/// After a commit's signal, how long to wait for more before reading: under
/// a stream of commits, one read serves many.
const COALESCE: Duration = Duration::from_millis(5);
/// After a failed read of the outbox.
const ERROR_PAUSE: Duration = Duration::from_secs(1);
/// Recording an attempt is tried again this many times (with a growing
/// pause) before the delivery is left to be sent again.
const RECORD_ATTEMPTS: u32 = 8;

pub struct OutboxWorker {
    outbox: Arc<dyn Outbox>,
    engine: WebhookEngine,
}

/// What is in flight: deliveries by outbox id, and how many per endpoint
/// and per owner. Deliveries finished while a read of the outbox was under
/// way are remembered until a read that began after them: that read's
/// snapshot may still show them as they were.
#[derive(Default)]
struct InFlight {
    deliveries: HashSet<i64>,
    per_endpoint: HashMap<WebhookId, usize>,
    per_owner: HashMap<Owner, usize>,
    /// Reads of the outbox begun so far.
    reads: u64,
    /// Finished deliveries, with the number of reads begun when they finished.
    finished: HashMap<i64, u64>,
}

impl InFlight {
    /// A read begins: what finished before it, it sees as committed.
    fn begin_read(&mut self) -> u64 {
        self.reads += 1;
        let read = self.reads;
        self.finished.retain(|_, finished_during| *finished_during >= read);
        read
    }

    fn take(&mut self, delivery: &PendingDelivery, read: u64, limits: &DeliveryLimits) -> bool {
        let endpoint = self.per_endpoint.get(&delivery.endpoint.id).copied().unwrap_or(0);
        let owner = self.per_owner.get(&delivery.endpoint.owner).copied().unwrap_or(0);
        if endpoint >= limits.per_endpoint
            || owner >= limits.per_owner
            || self.deliveries.contains(&delivery.place)
            || self.finished.get(&delivery.place).is_some_and(|finished_during| *finished_during >= read)
        {
            return false;
        }
        self.deliveries.insert(delivery.place);
        *self.per_endpoint.entry(delivery.endpoint.id).or_default() += 1;
        *self.per_owner.entry(delivery.endpoint.owner.clone()).or_default() += 1;
        true
    }

    fn finish(&mut self, delivery: &PendingDelivery) {
        self.deliveries.remove(&delivery.place);
        self.finished.insert(delivery.place, self.reads);
        release(&mut self.per_endpoint, &delivery.endpoint.id);
        release(&mut self.per_owner, &delivery.endpoint.owner);
    }

    /// The endpoints and owners with as many in flight as they may.
    fn saturated(&self, limits: &DeliveryLimits) -> DueSkip {
        DueSkip {
            endpoints: self
                .per_endpoint
                .iter()
                .filter(|(_, count)| **count >= limits.per_endpoint)
                .map(|(id, _)| *id)
                .collect(),
            owners: self
                .per_owner
                .iter()
                .filter(|(_, count)| **count >= limits.per_owner)
                .map(|(owner, _)| owner.clone())
                .collect(),
        }
    }
}

fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

/// A delivery taken from the outbox, and its place among those in flight.
struct Taken {
    in_flight: Arc<Mutex<InFlight>>,
    delivery: PendingDelivery,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Taken {
    fn drop(&mut self) {
        agent_runs_ports::lock(&self.in_flight).finish(&self.delivery);
    }
}

struct DeliveryLimits {
    per_endpoint: usize,
    per_owner: usize,
}

impl OutboxWorker {
    pub fn new(outbox: Arc<dyn Outbox>, engine: WebhookEngine) -> Self {
        OutboxWorker { outbox, engine }
    }

    /// Delivers until `stop` is sent (or dropped); deliveries in flight then
    /// are dropped unrecorded (they are in the outbox still, and go out again).
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let policy = self.engine.deliverer().policy();
        let limits =
            DeliveryLimits { per_endpoint: policy.per_endpoint_concurrency, per_owner: policy.per_owner_concurrency };
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let slots = Arc::new(Semaphore::new(policy.concurrency));
        let mut tasks = JoinSet::new();
        let worker = Arc::new(self);
        loop {
            let mut started = 0;
            let (read, saturated) = {
                let mut in_flight = agent_runs_ports::lock(&in_flight);
                (in_flight.begin_read(), in_flight.saturated(&limits))
            };
            match worker
                .outbox
                .due_deliveries(worker.engine.clock().now(), &saturated, limits.per_endpoint as u32)
                .await
            {
                Ok(due) => {
                    for delivery in due {
                        let Ok(slot) = slots.clone().try_acquire_owned() else { break };
                        if !agent_runs_ports::lock(&in_flight).take(&delivery, read, &limits) {
                            continue;
                        }
                        let worker = worker.clone();
                        // Released when the task ends, even by a panic.
                        let taken = Taken { in_flight: in_flight.clone(), delivery, _slot: slot };
                        tasks.spawn(async move { worker.deliver(&taken.delivery).await });
                        started += 1;
                    }
                }
                Err(error) => {
                    tracing::error!(error = %error_chain(&error), "cannot read the webhook outbox");
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
            // Sleep until a commit queues deliveries, one in flight ends (its
            // endpoint may have more waiting), or the poll comes round.
            let pause = if started > 0 { Duration::ZERO } else { IDLE_POLL };
            let committed = tokio::select! {
                _ = stop.changed() => break,
                _ = worker.outbox.deliveries_queued() => true,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => false,
                _ = tokio::time::sleep(pause), if started == 0 => false,
            };
            if committed {
                tokio::time::sleep(COALESCE).await;
            }
            while tasks.try_join_next().is_some() {}
        }
        tasks.abort_all();
    }

    /// Takes the delivery's step with the endpoint as the outbox read found
    /// it (deleting or disabling it removes its outbox rows; a delivery read
    /// just before goes out, and its record is dropped).
    async fn deliver(&self, delivery: &PendingDelivery) {
        let webhook_id = delivery.endpoint.id;
        match self.engine.deliver(&OutboxQueue(self.outbox.as_ref()), delivery).await {
            Ok(Delivered::Attempted(result)) => tracing::debug!(
                %webhook_id,
                event_id = %result.attempt.event_id,
                attempt = result.attempt.attempt,
                status = ?result.attempt.http_status,
                "webhook attempt"
            ),
            Ok(Delivered::Held(held)) => tracing::debug!(%webhook_id, until = %held.settles, "a run.created held"),
            Err(error) => {
                // Left in the outbox as it was, and taken again after a pause
                // (not at once: the store is failing).
                tracing::error!(error = %error_chain(&error), %webhook_id, "a webhook delivery stays in the outbox");
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
}

/// The outbox as the engine's queue: a delivery's place is its row.
pub struct OutboxQueue<'a>(pub &'a dyn Outbox);

#[async_trait]
impl DeliveryQueue for OutboxQueue<'_> {
    type Place = i64;

    /// The attempt was made: it is recorded, trying again rather than send
    /// it again. Only if the store stays down is it left in the outbox as it
    /// was, to be sent again (at least once).
    async fn finish(&self, delivery: &Delivery<i64>, result: &AttemptResult) -> Result<(), DeliveryError> {
        let mut pause = Duration::from_millis(100);
        let mut tries_left = RECORD_ATTEMPTS;
        loop {
            tries_left -= 1;
            match self.0.finish_delivery(delivery, &result.attempt, result.health, result.retry_at).await {
                Ok(()) => return Ok(()),
                Err(error) if tries_left == 0 => return Err(DeliveryError::Record(error)),
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), webhook_id = %delivery.endpoint.id, "cannot record a webhook attempt; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    }

    /// Until the create is surely answered: the run's second event, when
    /// it commits, makes the row due at once.
    async fn hold(&self, delivery: &Delivery<i64>, held: Held) -> Result<(), DeliveryError> {
        self.0.hold_delivery(delivery, held.settles).await.map_err(DeliveryError::Hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_runs_ports::store::{EventBody, StoredEvent};

    fn delivery(id: i64, endpoint: u128, owner: &str) -> PendingDelivery {
        let at = agent_runs_domain::Timestamp::from_millis(0);
        PendingDelivery {
            place: id,
            endpoint: agent_runs_domain::WebhookEndpoint {
                id: WebhookId::from_ulid(ulid::Ulid::from_parts(1, endpoint)),
                owner: Owner::parse(owner).unwrap(),
                url: "https://example.com/hook".into(),
                events: agent_runs_domain::EventFilter::All,
                description: None,
                status: agent_runs_domain::WebhookStatus::Enabled,
                created_at: at,
                secret: agent_runs_domain::WebhookSecret::generate(),
                previous_secrets: Vec::new(),
                failing_since: None,
            },
            run_id: agent_runs_domain::RunId::from_ulid(ulid::Ulid::from_parts(1, 1)),
            event: StoredEvent {
                seq: 1,
                kind: "run.created".into(),
                at,
                data: EventBody::stored(agent_runs_ports::store::RENDERED_FORMAT, "{}".into()),
            },
            attempts: 0,
        }
    }

    #[test]
    fn a_delivery_finished_during_a_read_is_not_taken_from_that_read() {
        let limits = DeliveryLimits { per_endpoint: 4, per_owner: 16 };
        let mut in_flight = InFlight::default();
        let first = delivery(1, 1, "acme");
        let read = in_flight.begin_read();
        assert!(in_flight.take(&first, read, &limits));
        assert!(!in_flight.take(&first, read, &limits), "in flight");
        // A read begins, then the delivery finishes (its commit may be
        // after the read's snapshot): that read's copy is stale.
        let during = in_flight.begin_read();
        in_flight.finish(&first);
        assert!(!in_flight.take(&first, during, &limits));
        // A read begun after the finish sees the committed outbox.
        let after = in_flight.begin_read();
        assert!(in_flight.take(&first, after, &limits));
        assert!(in_flight.finished.is_empty(), "remembered only as long as needed");
    }

    #[test]
    fn one_endpoint_and_one_owner_take_at_most_their_share() {
        let limits = DeliveryLimits { per_endpoint: 2, per_owner: 3 };
        let mut in_flight = InFlight::default();
        let read = in_flight.begin_read();
        let taken: Vec<bool> = [delivery(1, 1, "acme"), delivery(2, 1, "acme"), delivery(3, 1, "acme")]
            .iter()
            .map(|delivery| in_flight.take(delivery, read, &limits))
            .collect();
        assert_eq!(taken, [true, true, false], "two per endpoint");
        assert_eq!(in_flight.saturated(&limits).endpoints.len(), 1);
        assert!(in_flight.take(&delivery(4, 2, "acme"), read, &limits));
        assert!(!in_flight.take(&delivery(5, 3, "acme"), read, &limits), "three per owner");
        assert_eq!(in_flight.saturated(&limits).owners, [Owner::parse("acme").unwrap()]);
        assert!(in_flight.take(&delivery(6, 4, "other"), read, &limits), "another owner is not held up");
    }
}
