//! Executing runs: claim with a lease, step the agent, heartbeat, notice a
//! cancel, park for approval, finish. Every write is conditional on the
//! version read, and every worker write also requires that the claim's
//! lease is still the run's, so a late or duplicate worker can never
//! overwrite a state it does not own.

mod policies;
mod pool;
mod step;
mod sweeper;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::Instrument;

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{
    ClaimOutcome, Clock, EventData, ExecutionPolicy, IdGenerator, Run, Timestamp, TransitionError,
};
use agent_runs_platform::telemetry::{self, Span, SpanKind};
use agent_runs_ports::queue::RunMessage;
use agent_runs_ports::store::{ChangeError, PolicyStore, RunStore, StoreError, Transition, change_run, change_run_if};

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
enum Limited {
    Yes,
    /// The write that fails the run for reaching it.
    No,
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

/// One claim of a run.
struct Attempt {
    /// This claim's lease token: a new one for every claim, so a process
    /// whose earlier attempt died never mistakes the dead lease for its own.
    lease: String,
    /// The run as last written or read.
    run: Run,
    /// The agent's latest state, saved or not yet: whatever hands the run
    /// back hands this back, so nothing the agent did is done again.
    checkpoint: Option<serde_json::Value>,
    /// When the last write that renewed the lease was sent (the claim's,
    /// at first): the lease runs from no later than this.
    renewed_at: Instant,
    /// What the agent reported since the last write that carried events.
    /// Only a write that also saves the checkpoint covering them carries
    /// them, so an event is never written twice nor for work done again.
    events: Vec<EventData>,
    /// The stored version a claim made in memory only was made on (see
    /// [`Worker::claim`]): until a write bumps it, nothing of the attempt
    /// is stored.
    claimed_unwritten_at: Option<u64>,
}

impl Attempt {
    fn claim_unwritten(&self) -> bool {
        self.claimed_unwritten_at == Some(self.run.version)
    }
}

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

    /// Stopping: the run goes back to the queue with the agent's latest state.
    async fn hand_back(&self, attempt: &mut Attempt) -> Result<Outcome, WorkerError> {
        if attempt.claim_unwritten() {
            // Nothing of the attempt is stored (the run is queued as it
            // was), unless a write carrying the claim landed though its
            // answer was lost: then the run is released as any other.
            match self.runs.get(&attempt.run.owner, attempt.run.id).await? {
                Some(current) if current.held_by(&attempt.lease) => {}
                _ => return Ok(Outcome::Released),
            }
        }
        let checkpoint = attempt.checkpoint.clone();
        // Only this attempt writes the run while it holds it: a newer stored
        // version is a write of its own whose answer was lost, and what that
        // stored (a save, with the approvals a rule decided) is kept.
        let known = attempt.run.version;
        let outcome = self
            .finish(attempt, Vec::new(), |run, now, lease| {
                let checkpoint = if run.version == known { checkpoint.clone() } else { None };
                run.release(lease, checkpoint, now, &self.policy)
            })
            .await?;
        if outcome == Outcome::LostLease {
            // A release whose answer was lost (it landed, and the retry
            // found the lease gone) reads as a lost lease; what matters is
            // that the run is back in the queue.
            // (Should another worker have queued it, the message sent
            // again is a harmless duplicate.) `attempt.run` stays as this
            // worker last stored it, so only its own progress is counted.
            if let Some(current) = self.runs.get(&attempt.run.owner, attempt.run.id).await?
                && current.status == agent_runs_domain::RunStatus::Queued
            {
                return Ok(Outcome::Released);
            }
        }
        Ok(outcome)
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

    /// Applies a transition under the attempt's lease and writes it with
    /// the agent's `events` before the transition's own, re-reading on a
    /// conflict. A write that adds events is refused when the log would
    /// pass its limit (keeping room for the run's last event), unless it is
    /// the failure for that.
    async fn write(
        &self,
        run: &mut Run,
        lease: &str,
        events: &[EventData],
        limited: Limited,
        change: impl Fn(&mut Run, Timestamp, &str) -> Result<(), TransitionError>,
    ) -> Result<Result<(), Refused>, WorkerError> {
        // Only the attempt holding the run counts its tokens.
        let usage = run.usage;
        // While this attempt holds the run, nobody else adds events: a log
        // longer than when this write began means that an earlier try of
        // it landed though its answer was lost, events and all.
        let logged = run.event_seq;
        let written = change_run(self.runs.as_ref(), &run.owner, run.id, Some(run.clone()), |next| {
            next.usage = usage;
            let now = self.clock.now();
            if next.event_seq == logged {
                for event in events {
                    next.record(now, event.clone());
                }
            }
            change(next, now, lease).map_err(|_| Refused::LeaseLost)?;
            let room = if next.status.is_terminal() { 0 } else { 1 };
            let adds = !next.pending_events.is_empty();
            if limited == Limited::Yes && adds && next.events_logged() + room > self.policy.max_events {
                return Err(Refused::EventLimit);
            }
            Ok(Transition::Write(()))
        })
        .await;
        match written {
            Ok((next, ())) => {
                *run = next;
                Ok(Ok(()))
            }
            Err(ChangeError::Gone) => Ok(Err(Refused::LeaseLost)),
            Err(ChangeError::Refused(refused)) => Ok(Err(refused)),
            Err(ChangeError::Store(error)) => Err(error.into()),
        }
    }

    /// The agent reported more than the run's log may hold: the run fails,
    /// without the events that did not fit. Until that write lands they stay
    /// with the attempt, which a hand-back then carries (and is refused for
    /// the limit in turn).
    async fn fail_for_event_limit(&self, attempt: &mut Attempt) -> Result<Outcome, WorkerError> {
        let error = agent_runs_domain::event_limit_message(self.policy.max_events);
        tracing::warn!(run_id = %attempt.run.id, "run failed: its log reached the event limit");
        let failed = self
            .write(&mut attempt.run, &attempt.lease, &[], Limited::No, |run, now, lease| {
                run.fail(lease, error.clone(), now)
            })
            .await?;
        attempt.events.clear();
        Ok(if failed.is_ok() { Outcome::Failed } else { Outcome::LostLease })
    }

    /// Writes a transition under the attempt's lease with the agent's
    /// events so far and `more` of the last step, and says where the run is.
    async fn finish(
        &self,
        attempt: &mut Attempt,
        more: Vec<EventData>,
        change: impl Fn(&mut Run, Timestamp, &str) -> Result<(), TransitionError>,
    ) -> Result<Outcome, WorkerError> {
        let mut events = std::mem::take(&mut attempt.events);
        let covered = events.len();
        events.extend(more);
        let written = self.write(&mut attempt.run, &attempt.lease, &events, Limited::Yes, change).await;
        if !matches!(written, Ok(Ok(()))) {
            // Not written: what the saved checkpoint covers stays with the
            // attempt for whatever writes next (a hand-back, the failure for
            // the limit); the last step's own events go with the step.
            events.truncate(covered);
            attempt.events = events;
        }
        match written {
            Ok(Ok(())) => {}
            Ok(Err(Refused::LeaseLost)) => return Ok(Outcome::LostLease),
            Ok(Err(Refused::EventLimit)) => return self.fail_for_event_limit(attempt).await,
            Err(error) => return Err(error),
        }
        let run = &attempt.run;
        tracing::debug!(run_id = %run.id, status = run.status.as_str(), "run moved");
        Ok(match run.status {
            agent_runs_domain::RunStatus::Succeeded => Outcome::Succeeded,
            agent_runs_domain::RunStatus::Failed => Outcome::Failed,
            agent_runs_domain::RunStatus::AwaitingApproval => Outcome::AwaitingApproval,
            _ => Outcome::Released,
        })
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
