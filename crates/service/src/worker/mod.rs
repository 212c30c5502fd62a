//! Executing runs: claim with a lease, step the agent, heartbeat, notice a
//! cancel, park for approval, finish. Every write is conditional on the
//! version read, and every worker write also requires that the claim's
//! lease is still the run's, so a late or duplicate worker can never
//! overwrite a state it does not own.

mod attempt;
mod policies;
mod pool;
mod step;
mod sweeper;
mod writes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::Instrument;

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{ClaimOutcome, Clock, ExecutionPolicy, IdGenerator, Run};
use agent_runs_platform::telemetry::{self, Span, SpanKind};
use agent_runs_ports::queue::RunMessage;
use agent_runs_ports::store::{ChangeError, PolicyStore, RunStore, StoreError, Transition, change_run, change_run_if};

use attempt::Attempt;
pub use pool::{MAX_DELIVERIES, PoolSettings, WorkerPool};
pub use sweeper::{MAX_SWEEP_FAILURES, SweepReport, Sweeper};

/// What became of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    AwaitingApproval,
    /// The worker was asked to stop and handed the run back to the queue.
    Released,
    /// Nothing to do: the run is gone, terminal, awaiting a decision or held
    /// by another worker's live lease. The message is acknowledged.
    Dropped,
    /// The run was canceled or taken over while this worker had it.
    LostLease,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::AwaitingApproval => "awaiting_approval",
            Outcome::Released => "released",
            Outcome::Dropped => "dropped",
            Outcome::LostLease => "lost_lease",
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("transient failure")]
    Transient(#[from] StoreError),
}

/// Whether a write is held to the run's event limit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EventLimit {
    Applies,
    /// Waived for the write that fails the run for reaching it.
    Waived,
}

/// Why a worker's write was not made.
enum Refused {
    /// The run is no longer this attempt's (canceled, taken over, gone).
    LeaseLost,
    /// The write would take the run's log past its limit.
    EventLimit,
}

/// Approvals one run may ask for in all. Each is an event when asked,
/// decided, canceled or expired, and a cancel writes all pending ones in one
/// transaction (DynamoDB takes at most 100 items); and the run keeps every
/// approval with its action and comment (a question up to 8 KB, a comment
/// up to 4 KB), which must fit in its item (400 KB on DynamoDB) with its
/// input, output and arguments. Nothing checks that sum: 50 of the longest
/// questions in four-byte characters with the longest comments would not
/// fit, and the write that would pass it is refused. (The events that
/// embed the run cut them past `SNAPSHOT_APPROVAL_TEXT_BYTES`.)
pub const MAX_APPROVALS_PER_RUN: usize = 50;

/// Events the agent produced are written at the latest this long after
/// the last write, or at this many, so clients follow a run as it goes.
const EVENTS_FLUSH_EVERY: Duration = Duration::from_millis(100);
const EVENTS_FLUSH_AT: usize = 25;

/// A dependency failed; the message should be delivered again later.
#[derive(Debug, thiserror::Error)]
#[error("transient failure")]
pub struct Interrupted {
    #[source]
    pub error: StoreError,
    /// Whether the agent got further than the run's saved state before
    /// the failure (a message that keeps failing without progress is a
    /// defect, one that makes progress is not).
    pub progressed: bool,
}

pub struct Worker {
    runs: Arc<dyn RunStore>,
    agents: AgentRegistry,
    clock: Arc<dyn Clock>,
    policy: ExecutionPolicy,
    ids: IdGenerator,
    /// How often the lease is renewed (and progress saved) while the agent works.
    heartbeat_every: Duration,
    id: String,
    /// Owners' approval policies; none: every tool decides for itself.
    policies: Option<Arc<policies::PolicyCache>>,
}

/// Between steps that write nothing, the run is read at most this often to
/// notice a cancel (a write's condition notices it at once).
const CANCEL_CHECK_EVERY: Duration = Duration::from_secs(1);

/// How a claim is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Written by itself before the agent steps.
    First,
    /// For an agent that ends a run at its first step: in memory only, and
    /// written with whatever the attempt writes first (its end).
    WithTheEnd,
}

impl Worker {
    pub fn new(runs: Arc<dyn RunStore>, agents: AgentRegistry, clock: Arc<dyn Clock>, policy: ExecutionPolicy) -> Self {
        let ids = IdGenerator::default();
        let id = format!("wrk_{}", ids.ulid_at(clock.now()));
        let heartbeat_every = policy.lease / 3;
        Worker { runs, agents, clock, policy, ids, heartbeat_every, id, policies: None }
    }

    /// Applies each owner's approval policy to its runs' tool calls.
    pub fn with_policies(self, policies: Arc<dyn PolicyStore>) -> Self {
        Worker { policies: Some(Arc::new(policies::PolicyCache::new(policies))), ..self }
    }

    /// Handles one message to the end. `stop` asks the worker to hand the
    /// run back after the step in flight (shutdown, or the Lambda deadline).
    pub async fn process(&self, message: &RunMessage, stop: &watch::Receiver<bool>) -> Result<Outcome, Interrupted> {
        // Every line logged for this message carries the run and its owner.
        let span = tracing::info_span!(
            "run",
            run_id = %message.run_id,
            owner = %message.owner,
            trace_id = tracing::field::Empty,
        );
        self.process_in_span(message, stop).instrument(span).await
    }

    async fn process_in_span(
        &self,
        message: &RunMessage,
        stop: &watch::Receiver<bool>,
    ) -> Result<Outcome, Interrupted> {
        if let Some(outcome) = self.attempt(message, stop, Claim::WithTheEnd).await? {
            return Ok(outcome);
        }
        // An end carrying its claim was refused: another write came first.
        // Ended, canceled or gone, nothing is left to do; still queued (a
        // replay's pin, the sweeper's resend), the run is claimed again,
        // this time with the claim written first.
        match self.runs.get(&message.owner, message.run_id).await {
            Ok(Some(run)) if run.status == agent_runs_domain::RunStatus::Queued => {
                Ok(self.attempt(message, stop, Claim::First).await?.unwrap_or(Outcome::LostLease))
            }
            Ok(_) => Ok(Outcome::LostLease),
            Err(error) => Err(Interrupted { error, progressed: false }),
        }
    }

    /// One claim of the message's run and the agent's steps under it;
    /// `None` when the write that would have stored the claim was refused.
    async fn attempt(
        &self,
        message: &RunMessage,
        stop: &watch::Receiver<bool>,
        claim: Claim,
    ) -> Result<Option<Outcome>, Interrupted> {
        if *stop.borrow() {
            // Not even claimed: whoever stops us sends the message again.
            return Ok(Some(Outcome::Released));
        }
        let lease = format!("{}.{}", self.id, self.ids.ulid_at(self.clock.now()));
        let renewed_at = Instant::now();
        let (run, claimed_unwritten_at) = match self.claim(message, &lease, claim).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => return Ok(Some(Outcome::Dropped)),
            Err(WorkerError::Transient(error)) => return Err(Interrupted { error, progressed: false }),
        };
        let trace = run.trace();
        tracing::Span::current().record("trace_id", tracing::field::display(trace.trace_id_hex()));
        tracing::debug!(run_id = %run.id, %lease, attempt = run.attempts, "claimed");
        let mut span = Span::child_of(trace.as_parent(), "run attempt", SpanKind::Internal);
        if let Some(span) = &mut span {
            span.set("agent_runs.run.id", run.id.to_string());
            span.set("agent_runs.attempt", i64::from(run.attempts));
            span.set("gen_ai.agent.name", run.agent.clone());
        }
        let claimed = run.checkpoint.clone();
        let checkpoint = run.own_checkpoint().cloned();
        let mut attempt = Attempt { lease, checkpoint, run, renewed_at, events: Vec::new(), claimed_unwritten_at };
        let executed = telemetry::within(span.as_ref().map(Span::as_parent), self.execute(&mut attempt, stop)).await;
        if let Some(mut span) = span {
            match &executed {
                Ok(outcome) => span.set("agent_runs.attempt.outcome", outcome.as_str()),
                Err(WorkerError::Transient(error)) => span.fail("store_unavailable", error.to_string()),
            }
            span.end();
        }
        match executed {
            Ok(Outcome::LostLease) if attempt.claim_unwritten() => Ok(None),
            Ok(outcome) => Ok(Some(outcome)),
            Err(WorkerError::Transient(error)) => {
                // A failing dependency is not the run's fault: hand it back,
                // if the store lets us, so the attempt is not used up.
                // Otherwise the lease expires as after a crash.
                let _ = self.hand_back(&mut attempt).await;
                // Progress counts only once stored (`run` is as last written).
                Err(Interrupted { error, progressed: attempt.run.checkpoint != claimed })
            }
        }
    }

    /// Fails the run of a message that kept failing, unless it has moved on.
    pub async fn abandon(&self, message: &RunMessage) -> Result<bool, StoreError> {
        abandon_dead_letter(self.runs.as_ref(), self.clock.as_ref(), message).await
    }

    /// Takes the run under `lease`, or `None` when there is nothing to do;
    /// with the stored version a claim made in memory only was made on.
    /// With [`Claim::WithTheEnd`], the claim of a run whose agent ends it
    /// at once is not written on its own: the run's end (or whatever else
    /// the attempt writes first) carries it, on the condition that the run
    /// is still as read.
    async fn claim(
        &self,
        message: &RunMessage,
        lease: &str,
        claim: Claim,
    ) -> Result<Option<(Run, Option<u64>)>, WorkerError> {
        let Some(stored) = self.runs.get(&message.owner, message.run_id).await? else {
            tracing::warn!(run_id = %message.run_id, "message for a run that does not exist");
            return Ok(None);
        };
        if claim == Claim::WithTheEnd && self.agents.ends_at_once(&stored.agent) {
            let mut run = stored.clone();
            if let Ok(ClaimOutcome::Claimed) = run.claim(lease, self.clock.now(), &self.policy) {
                return Ok(Some((run, Some(stored.version))));
            }
        }
        let claimed = change_run(self.runs.as_ref(), &message.owner, message.run_id, Some(stored), |run| {
            // A claim whose answer was lost, and whose retry found it made.
            if run.held_by(lease) {
                return Ok(Transition::Keep(ClaimOutcome::Claimed));
            }
            run.claim(lease, self.clock.now(), &self.policy).map(Transition::Write)
        })
        .await;
        match claimed {
            Ok((run, ClaimOutcome::Claimed)) => Ok(Some((run, None))),
            Ok((run, ClaimOutcome::AttemptsExhausted)) => {
                tracing::warn!(run_id = %run.id, "run failed: attempts exhausted");
                Ok(None)
            }
            Err(ChangeError::Gone) => {
                tracing::warn!(run_id = %message.run_id, "message for a run that does not exist");
                Ok(None)
            }
            Err(ChangeError::Refused(reason)) => {
                tracing::debug!(run_id = %message.run_id, ?reason, "message dropped");
                Ok(None)
            }
            Err(ChangeError::Store(error)) => Err(error.into()),
        }
    }
}

/// A message that reached the dead-letter queue: fail its run unless the
/// run has moved on. `Ok(true)` when the run was failed here.
pub async fn abandon_dead_letter(
    runs: &dyn RunStore,
    clock: &dyn Clock,
    message: &RunMessage,
) -> Result<bool, StoreError> {
    change_run_if(runs, &message.owner, message.run_id, |run| run.abandon(clock.now())).await
}
