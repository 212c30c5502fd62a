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

use super::Deliverer;
use crate::domain::{Clock, WebhookId, WebhookStatus};
use crate::error_chain;
use crate::store::{Outbox, PendingDelivery, WebhookStore};

/// How long the worker sleeps when nothing is due and no commit woke it:
/// the latest a retry falls due is this much after its time.
const IDLE_POLL: Duration = Duration::from_millis(500);
/// After a commit's signal, how long to wait for more before reading: under
/// a stream of commits, one read serves many.
const COALESCE: Duration = Duration::from_millis(5);
/// After a failed read of the outbox.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

pub struct OutboxWorker {
    outbox: Arc<dyn Outbox>,
    webhooks: Arc<dyn WebhookStore>,
    deliverer: Deliverer,
}

/// What is in flight: deliveries by outbox id, and how many per endpoint.
#[derive(Default)]
struct InFlight {
    deliveries: HashSet<i64>,
    per_endpoint: HashMap<WebhookId, usize>,
}

impl OutboxWorker {
    pub fn new(outbox: Arc<dyn Outbox>, webhooks: Arc<dyn WebhookStore>, deliverer: Deliverer) -> Self {
        OutboxWorker { outbox, webhooks, deliverer }
    }

    /// Delivers until `stop` is sent (or dropped); deliveries in flight then are
    /// dropped unrecorded (they are in the outbox still, and go out again).
    pub async fn run(self, clock: Arc<dyn Clock>, mut stop: watch::Receiver<bool>) {
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let slots = Arc::new(Semaphore::new(self.deliverer.policy().concurrency));
        let per_endpoint = self.deliverer.policy().per_endpoint_concurrency;
        let mut tasks = JoinSet::new();
        let worker = Arc::new(self);
        loop {
            let mut started = 0;
            let saturated: Vec<WebhookId> = crate::lock(&in_flight)
                .per_endpoint
                .iter()
                .filter(|(_, count)| **count >= per_endpoint)
                .map(|(id, _)| *id)
                .collect();
            match worker.outbox.due_deliveries(clock.now(), &saturated, per_endpoint as u32).await {
                Ok(due) => {
                    for delivery in due {
                        {
                            let mut taken = crate::lock(&in_flight);
                            let count = taken.per_endpoint.get(&delivery.webhook_id).copied().unwrap_or(0);
                            if count >= per_endpoint || taken.deliveries.contains(&delivery.id) {
                                continue;
                            }
                            let Ok(slot) = slots.clone().try_acquire_owned() else { break };
                            taken.deliveries.insert(delivery.id);
                            *taken.per_endpoint.entry(delivery.webhook_id).or_default() += 1;
                            let (worker, in_flight) = (worker.clone(), in_flight.clone());
                            tasks.spawn(async move {
                                worker.deliver(&delivery).await;
                                let mut in_flight = crate::lock(&in_flight);
                                in_flight.deliveries.remove(&delivery.id);
                                if let Some(count) = in_flight.per_endpoint.get_mut(&delivery.webhook_id) {
                                    *count -= 1;
                                    if *count == 0 {
                                        in_flight.per_endpoint.remove(&delivery.webhook_id);
                                    }
                                }
                                drop(slot);
                            });
                        }
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

    async fn deliver(&self, delivery: &PendingDelivery) {
        let endpoint = match self.webhooks.get_webhook(&delivery.owner, delivery.webhook_id).await {
            Ok(Some(endpoint)) if endpoint.status == WebhookStatus::Enabled => endpoint,
            // Deleting or disabling an endpoint removes its outbox rows;
            // one read just before is left to the next pass.
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "cannot read a webhook endpoint; retrying");
                tokio::time::sleep(ERROR_PAUSE).await;
                return;
            }
        };
        let result = self.deliverer.attempt(&endpoint, delivery.run_id, &delivery.event, delivery.attempts + 1).await;
        let finished = self.outbox.finish_delivery(delivery, &result.attempt, result.health, result.retry_at).await;
        if let Err(error) = finished {
            // The delivery stays in the outbox as it was, so it is sent again.
            tracing::error!(error = %error_chain(&error), webhook_id = %endpoint.id, "cannot record a webhook attempt");
            tokio::time::sleep(ERROR_PAUSE).await;
        }
        tracing::debug!(
            webhook_id = %endpoint.id,
            event_id = %result.attempt.event_id,
            attempt = result.attempt.attempt,
            status = ?result.attempt.http_status,
            "webhook attempt"
        );
    }
}
