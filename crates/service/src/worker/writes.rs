//! The attempt's writes: each under the claim's lease and conditional on
//! the version read, with the agent's events the state they lead to
//! covers. The steps (`step.rs`) and the claim (`mod.rs`) end in these;
//! these call neither.

use agent_runs_domain::{EventData, Run, Timestamp, TransitionError};
use agent_runs_ports::store::{ChangeError, Transition, change_run};

use super::attempt::Attempt;
use super::{EventLimit, Outcome, Refused, Worker, WorkerError};

impl Worker {
    /// Stopping: the run goes back to the queue with the agent's latest state.
    pub(super) async fn hand_back(&self, attempt: &mut Attempt) -> Result<Outcome, WorkerError> {
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

    /// Applies a transition under the attempt's lease and writes it with
    /// the agent's `events` before the transition's own, re-reading on a
    /// conflict. A write that adds events is refused when the log would
    /// pass its limit (keeping room for the run's last event), unless it is
    /// the failure for that.
    pub(super) async fn write(
        &self,
        run: &mut Run,
        lease: &str,
        events: &[EventData],
        limited: EventLimit,
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
            if limited == EventLimit::Applies && adds && next.events_logged() + room > self.policy.max_events {
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
    pub(super) async fn fail_for_event_limit(&self, attempt: &mut Attempt) -> Result<Outcome, WorkerError> {
        let error = agent_runs_domain::event_limit_message(self.policy.max_events);
        tracing::warn!(run_id = %attempt.run.id, "run failed: its log reached the event limit");
        let failed = self
            .write(&mut attempt.run, &attempt.lease, &[], EventLimit::Waived, |run, now, lease| {
                run.fail(lease, error.clone(), now)
            })
            .await?;
        attempt.events.clear();
        Ok(if failed.is_ok() { Outcome::Failed } else { Outcome::LostLease })
    }

    /// Writes a transition under the attempt's lease with the agent's
    /// events so far and `more` of the last step, and says where the run is.
    pub(super) async fn finish(
        &self,
        attempt: &mut Attempt,
        more: Vec<EventData>,
        change: impl Fn(&mut Run, Timestamp, &str) -> Result<(), TransitionError>,
    ) -> Result<Outcome, WorkerError> {
        let mut events = std::mem::take(&mut attempt.events);
        let covered = events.len();
        events.extend(more);
        let written = self.write(&mut attempt.run, &attempt.lease, &events, EventLimit::Applies, change).await;
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
