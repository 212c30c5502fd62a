//! What becomes of a delivery whose time has come, the same on every way of
//! running: a `run.created` waits until its create can no longer be
//! undone, then one signed attempt is made, and the queue the delivery
//! came from records it and schedules what follows. The queues are
//! [`DeliveryQueue`]s: the embedded server's outbox (`OutboxWorker`) and,
//! on AWS, the delivery queue in SQS (`agent_runs_lambda`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{AttemptResult, Deliverer};
use agent_runs_domain::{Clock, Timestamp};
use agent_runs_ports::queue::QueueError;
use agent_runs_ports::store::{Delivery, EventLog, StoreError};

/// A create is answered, or its invocation ended, within the API
/// function's timeout (10 s, template.yaml; a test holds it to this): by
/// then a create whose run could not be queued has been undone, and its
/// events with it. A `run.created` is not delivered before, unless its run
/// has moved on (a worker took it, so it was queued).
pub const CREATE_SETTLED_AFTER: Duration = Duration::from_secs(15);

/// How often a held `run.created` looks again whether its run moved on.
const HOLD_STEP: Duration = Duration::from_secs(2);

/// A delivery this close to its time is taken as due (SQS's delays are
/// whole seconds).
pub const EARLY_ENOUGH: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("cannot read whether the run moved on")]
    Read(#[source] StoreError),
    #[error("cannot record the attempt")]
    Record(#[source] StoreError),
    #[error("cannot put the delivery back")]
    Hold(#[source] StoreError),
    #[error("cannot claim the delivery's next attempt")]
    Claim(#[source] StoreError),
    #[error("cannot queue the delivery's next step")]
    Queue(#[source] QueueError),
}

/// Where deliveries wait between their steps.
#[async_trait]
pub trait DeliveryQueue: Send + Sync {
    /// A delivery's place in the queue.
    type Place: Send + Sync;

    /// Records the attempt and its effect on the endpoint, then queues the
    /// delivery's next attempt at `result.retry_at`, or drops it.
    async fn finish(&self, delivery: &Delivery<Self::Place>, result: &AttemptResult) -> Result<(), DeliveryError>;

    /// Puts the delivery back, not attempted: until `held.look_again` where
    /// nothing wakes it, until `held.settles` where its store wakes it when
    /// its run moves on.
    async fn hold(&self, delivery: &Delivery<Self::Place>, held: Held) -> Result<(), DeliveryError>;
}

/// How long a `run.created` waits for its create's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// When to look again whether the run moved on.
    pub look_again: Timestamp,
    /// When the create is surely answered (at the latest, it goes then).
    pub settles: Timestamp,
}

/// What [`WebhookEngine::deliver`] did.
#[derive(Debug, Clone)]
pub enum Delivered {
    /// Put back, not attempted.
    Held(Held),
    Attempted(AttemptResult),
}

/// Delivers events to webhook endpoints: built once per process by the
/// composition root, fed by whichever queue the deployment has.
#[derive(Clone)]
pub struct WebhookEngine {
    deliverer: Deliverer,
    events: Arc<dyn EventLog>,
    clock: Arc<dyn Clock>,
}

impl WebhookEngine {
    pub fn new(deliverer: Deliverer, events: Arc<dyn EventLog>, clock: Arc<dyn Clock>) -> Self {
        WebhookEngine { deliverer, events, clock }
    }

    pub fn deliverer(&self) -> &Deliverer {
        &self.deliverer
    }

    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// The delivery's step: held, or attempted; either way handed back to
    /// `queue`. An error leaves the delivery where it was in its queue (a
    /// recorded attempt is never lost: it is made again, at least once).
    pub async fn deliver<Q: DeliveryQueue>(
        &self,
        queue: &Q,
        delivery: &Delivery<Q::Place>,
    ) -> Result<Delivered, DeliveryError> {
        if let Some(held) = self.held(delivery).await.map_err(DeliveryError::Read)? {
            queue.hold(delivery, held).await?;
            return Ok(Delivered::Held(held));
        }
        let number = delivery.attempts.saturating_add(1);
        let result = self.deliverer.attempt(&delivery.endpoint, delivery.run_id, &delivery.event, number).await;
        queue.finish(delivery, &result).await?;
        Ok(Delivered::Attempted(result))
    }

    /// Until when a `run.created` waits: while its create may still be
    /// undone and its run has not moved on (it has no second event), it
    /// looks again every [`HOLD_STEP`]; by [`CREATE_SETTLED_AFTER`] an
    /// undone create's event is gone (and its delivery with it).
    async fn held<P>(&self, delivery: &Delivery<P>) -> Result<Option<Held>, StoreError> {
        let event = &delivery.event;
        if event.seq != 1 || event.kind != "run.created" {
            return Ok(None);
        }
        let settles = event.at.plus(CREATE_SETTLED_AFTER);
        let now = self.clock.now();
        if settles <= now.plus(EARLY_ENOUGH) {
            return Ok(None);
        }
        let moved_on = self.events.event(delivery.run_id, 2).await?.is_some();
        Ok((!moved_on).then(|| Held { look_again: now.plus(HOLD_STEP).min(settles), settles }))
    }
}
