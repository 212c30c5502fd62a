//! The Run, its approvals and the state machine: which transitions are legal.
//!
//! Every transition is a method that checks the current state and changes the
//! run in memory. Stores persist the result with a conditional write on
//! `version`, so two writers that read the same version cannot both win.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::approval::{Approval, ApprovalStatus};
use crate::event::{ApprovalSummary, Event, EventData, EventText, NewEvent, RunSnapshot};
use crate::ids::{KeyId, Owner, RunId};
use crate::run_values::{Budget, RunStatus, ThreadLink, Usage};
use crate::time::Timestamp;
use crate::trace::RunTrace;

mod decisions;
mod work;

/// A worker's claim on a running run. Another claim may take the run over
/// only once `expires_at` has passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Names one claim, not a process: a worker takes a new token for every
    /// claim, so its own earlier, dead attempt never blocks a takeover.
    pub worker: String,
    pub expires_at: Timestamp,
}

/// The timings and limits of execution, set per deployment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionPolicy {
    /// How long a claim or heartbeat keeps a run for its worker.
    pub lease: Duration,
    /// How long a run may stay `queued` before the sweeper enqueues it again.
    pub requeue_after: Duration,
    /// How many times a worker may claim a run before it is failed.
    pub max_attempts: u32,
    /// How long an approval waits for a decision before it expires and the
    /// run fails.
    pub approval_timeout: Duration,
    /// How long a run may execute in all (time awaiting approval excluded).
    pub max_run_time: Duration,
    /// How long before an approval expires `approval.expiring` is recorded.
    pub approval_warning: Duration,
    /// The most events a run's log may hold: a run whose work would go
    /// beyond it fails instead (a cancel or decision that comes in then is
    /// still recorded, with the few events it makes).
    pub max_events: u64,
}

impl Default for ExecutionPolicy {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            requeue_after: Duration::from_secs(60),
            max_attempts: 3,
            approval_timeout: Duration::from_secs(24 * 60 * 60),
            max_run_time: Duration::from_secs(60 * 60),
            approval_warning: Duration::from_secs(60 * 60),
            max_events: 10_000,
        }
    }
}

/// A run: the fields clients see and the worker's bookkeeping. Stored as
/// the store's own record (`store/record.rs`), shown as the API's view.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub id: RunId,
    pub owner: Owner,
    pub status: RunStatus,
    pub agent: String,
    pub input: String,
    pub output: Option<String>,
    pub error: Option<String>,
    pub approvals: Vec<Approval>,
    /// The key that created the run; `None` for runs from before keys were
    /// recorded.
    pub created_by: Option<KeyId>,
    pub metadata: BTreeMap<String, String>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    /// Incremented by the store on every successful write.
    pub version: u64,
    /// When the sweeper must look at the run next; `None` once terminal.
    pub due_at: Option<Timestamp>,
    /// Claims so far in the current stretch of execution.
    pub attempts: u32,
    pub lease: Option<Lease>,
    /// The agent's opaque state, saved at heartbeats and when parked, and
    /// kept when the run ends: what a run continuing it carries on from.
    pub checkpoint: Option<serde_json::Value>,
    /// Whether `checkpoint` is still the one the run this one continues
    /// ended with: this run's agent has not saved a state of its own yet.
    pub checkpoint_carried: bool,
    /// The conversation the run continues; `None` for a run started afresh
    /// (the first of its own thread).
    pub thread: Option<ThreadLink>,
    /// Execution time used before the current claim, in milliseconds.
    pub execution_ms: u64,
    /// When the current claim started executing.
    pub running_since: Option<Timestamp>,
    /// Tokens the agent's model calls used, when the provider reports them,
    /// and tool calls made.
    pub usage: Option<Usage>,
    /// What the client limited the run to spend (the agent's own limits
    /// apply besides).
    pub budget: Budget,
    /// The run's trace; `None` for runs stored before runs had one (see
    /// [`Run::trace`]).
    pub trace: Option<RunTrace>,
    /// How often the sweeper sent the run again in its current stretch of
    /// `queued`: each wait before the next send is twice the last.
    pub resends: u32,
    /// What the store that wrote or read the run keeps with it for its own
    /// bookkeeping. Opaque here: the domain never reads or sets it, and a
    /// store gets it back with the run it handed out, as an HTTP client
    /// hands back an ETag.
    pub store_note: StoreNote,
    /// How many events the run's log holds (the `seq` of the last).
    pub event_seq: u64,
    /// Events of the changes made since the run was read, oldest first: the
    /// store writes them with the run and numbers them from `event_seq`.
    pub pending_events: Vec<NewEvent>,
}

/// A store's note on a run it handed out (see [`Run::store_note`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreNote {
    /// The item of the owner's active-run count the run's create took.
    pub count_item: Option<u32>,
    /// Whether a checkpoint of the run was ever stored apart from it;
    /// `None` when unknown (a run written by a store that kept no note).
    pub checkpoint_item: Option<bool>,
}

/// A transition that is not allowed from the run's current state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("the run is {}", .0.as_str())]
    InvalidState(RunStatus),
    #[error("no such approval")]
    NoSuchApproval,
    #[error("the approval is already {}", .0.as_str())]
    ApprovalAlreadyResolved(ApprovalStatus),
    #[error("the worker does not hold the run's lease")]
    LeaseLost,
    /// The decision was made for other arguments than the approval's.
    #[error("the arguments_sha256 sent is not the approval's")]
    ArgumentsChanged,
    /// Only a tool call's arguments can be edited.
    #[error("the approval has no arguments to edit")]
    NothingToEdit,
    /// The edit would take the run's approvals past
    /// [`crate::approval::MAX_APPROVAL_ARGUMENTS_PER_RUN`].
    #[error("the run's approvals would hold too many arguments")]
    TooManyArguments,
    /// `answer` on an approval that asks no question.
    #[error("the approval asks no question")]
    NotAQuestion,
    /// `approve` or `edit` on a question.
    #[error("a question is answered or rejected")]
    QuestionNeedsAnAnswer,
    /// The answer fails the question's schema (what is wrong, and where).
    #[error("{0}")]
    AnswerRefused(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Changed {
    Yes,
    /// The request was a repeat; nothing needs writing.
    No,
}

/// Ordered: of several decisions on one run, the greatest outcome is the
/// run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DecideOutcome {
    /// The approval already had this decision.
    Unchanged,
    /// Recorded; other approvals are still pending.
    Recorded,
    /// Recorded, and it was the last pending one: the run is `queued` again
    /// and must be enqueued.
    Requeued,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    Claimed,
    /// The run had used up its attempts; it is now `failed`.
    AttemptsExhausted,
}

/// Why a worker may not claim a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefused {
    Terminal,
    AwaitingApproval,
    LeaseHeld,
}

/// What the sweeper should do with a run whose due time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepAction {
    /// Not due after all (another writer moved it); nothing to write.
    Nothing,
    /// Send the run to the queue again (the due time moved forward).
    Enqueue,
    /// The run was failed (attempts exhausted).
    Failed,
    /// `approval.expiring` was recorded for approvals about to expire.
    Warned,
    /// Approvals whose veto window ended were approved; others still wait.
    AutoApproved,
}

/// The longest wait between two sends of a queued run is `requeue_after`
/// doubled this often (32 minutes by default, past SQS's visibility timeout
/// of 30, after which a received but unfinished message is visible again).
const MAX_RESEND_DOUBLINGS: u32 = 5;

pub fn time_limit_message(limit: Duration) -> String {
    format!("The run exceeded its execution time limit of {} seconds.", limit.as_secs())
}

pub(super) fn approval_expired_message(action: &str, timeout: Duration) -> String {
    let shown: String = action.chars().take(200).collect();
    format!("Nobody decided the approval \"{shown}\" within {} seconds; it expired.", timeout.as_secs())
}

/// When `approval.expiring` is due for an approval that expires then.
pub(super) fn warning_time(expires_at: Timestamp, policy: &ExecutionPolicy) -> Timestamp {
    Timestamp::from_millis(expires_at.millis() - policy.approval_warning.as_millis() as i64)
}

pub fn event_limit_message(max_events: u64) -> String {
    format!("The run was stopped: its log reached this deployment's limit of {max_events} events.")
}

pub fn attempts_exhausted_message(max_attempts: u32) -> String {
    format!("The run was stopped after {max_attempts} attempts: the worker executing it stopped responding each time.")
}

impl Run {
    pub fn new(
        id: RunId,
        owner: Owner,
        agent: String,
        input: String,
        metadata: BTreeMap<String, String>,
        policy: &ExecutionPolicy,
    ) -> Run {
        let created_at = id.timestamp();
        let mut run = Run {
            id,
            owner,
            status: RunStatus::Queued,
            agent,
            input,
            output: None,
            error: None,
            approvals: Vec::new(),
            created_by: None,
            metadata,
            created_at,
            started_at: None,
            completed_at: None,
            version: 0,
            due_at: Some(created_at.plus(policy.requeue_after)),
            attempts: 0,
            lease: None,
            checkpoint: None,
            checkpoint_carried: false,
            thread: None,
            execution_ms: 0,
            running_since: None,
            usage: None,
            budget: Budget::default(),
            trace: None,
            resends: 0,
            store_note: StoreNote::default(),
            event_seq: 0,
            pending_events: Vec::new(),
        };
        run.record(created_at, EventData::RunCreated(run.snapshot()));
        run
    }

    /// The new run changed by `change`, and its `run.created` with it.
    fn set_at_creation(mut self, change: impl Fn(&mut Run)) -> Run {
        change(&mut self);
        let snapshot = self.snapshot();
        for event in &mut self.pending_events {
            if let EventData::RunCreated(created) = &mut event.data {
                created.clone_from(&snapshot);
            }
        }
        self
    }

    /// The run as created by `key` (its `run.created` shows it too).
    pub fn created_by(self, key: KeyId) -> Run {
        self.set_at_creation(|run| run.created_by = Some(key))
    }

    /// The run in the trace `trace` (its `run.created` shows it too).
    pub fn with_trace(self, trace: RunTrace) -> Run {
        self.set_at_creation(|run| run.trace = Some(trace))
    }

    /// The run continuing `previous`'s conversation: in its thread, and
    /// carrying on from the state it ended with (its `run.created` shows
    /// the thread too).
    pub fn continuing(self, previous: &Run) -> Run {
        let thread = ThreadLink { thread_id: previous.thread_id(), previous_run_id: previous.id };
        let checkpoint = previous.checkpoint.clone();
        self.set_at_creation(|run| {
            run.thread = Some(thread);
            run.checkpoint_carried = checkpoint.is_some();
            run.checkpoint.clone_from(&checkpoint);
        })
    }

    /// The first run of the run's conversation (its own id when it
    /// continues none).
    pub fn thread_id(&self) -> RunId {
        self.thread.map_or(self.id, |thread| thread.thread_id)
    }

    pub fn previous_run_id(&self) -> Option<RunId> {
        self.thread.map(|thread| thread.previous_run_id)
    }

    /// The state the run's agent saved, if any (not the one carried over
    /// from the run it continues).
    pub fn own_checkpoint(&self) -> Option<&serde_json::Value> {
        self.checkpoint.as_ref().filter(|_| !self.checkpoint_carried)
    }

    /// What the run it continues ended with, until the agent saves a state
    /// of its own.
    pub fn carried_checkpoint(&self) -> Option<&serde_json::Value> {
        self.checkpoint.as_ref().filter(|_| self.checkpoint_carried)
    }

    /// Saves the agent's state (no longer the carried one).
    pub(super) fn save_checkpoint(&mut self, checkpoint: serde_json::Value) {
        self.checkpoint = Some(checkpoint);
        self.checkpoint_carried = false;
    }

    /// The run's trace, derived from its id for a run stored without one.
    pub fn trace(&self) -> RunTrace {
        self.trace.unwrap_or_else(|| RunTrace::derived(self.id))
    }

    /// The run limited to `budget` (its `run.created` shows it too).
    pub fn with_budget(self, budget: Budget) -> Run {
        self.set_at_creation(|run| run.budget = budget)
    }

    /// Adds the event of a change just made, to be written with it.
    pub fn record(&mut self, at: Timestamp, data: EventData) {
        self.pending_events.push(NewEvent { at: at.max(self.created_at), data });
    }

    /// The run as clients see it now, for an event that shows it.
    fn snapshot(&self) -> Box<RunSnapshot> {
        Box::new(RunSnapshot::of(self))
    }

    /// How many events the log will hold once the pending ones are written.
    pub fn events_logged(&self) -> u64 {
        self.event_seq + self.pending_events.len() as u64
    }

    /// Numbers the pending events after the last written one and counts
    /// them as written: what a store does in the write that stores them.
    pub fn take_events(&mut self) -> Vec<Event> {
        let first = self.event_seq + 1;
        self.event_seq += self.pending_events.len() as u64;
        self.pending_events
            .drain(..)
            .zip(first..)
            .map(|(event, seq)| Event { run_id: self.id, seq, at: event.at, data: event.data })
            .collect()
    }

    /// Cancels every pending approval (the run is ending).
    pub(super) fn cancel_pending_approvals(&mut self, now: Timestamp) {
        let mut canceled = Vec::new();
        for approval in &mut self.approvals {
            if approval.status == ApprovalStatus::Pending {
                approval.status = ApprovalStatus::Canceled;
                approval.resolved_at = Some(now.max(approval.requested_at));
                canceled.push(approval.clone());
            }
        }
        for approval in canceled {
            self.record(now, EventData::ApprovalCanceled(approval));
        }
    }

    /// Still exactly as its create inserted it: queued, never written since.
    pub fn is_as_created(&self) -> bool {
        self.version == 0 && self.status == RunStatus::Queued
    }

    /// Execution time so far, the current claim included.
    pub fn execution_time(&self, now: Timestamp) -> Duration {
        let current = self.running_since.map_or(Duration::ZERO, |since| now.since(since));
        Duration::from_millis(self.execution_ms) + current
    }

    /// Ends the current stretch of execution, adding it to the total.
    pub(super) fn stop_clock(&mut self, now: Timestamp) {
        if let Some(since) = self.running_since.take() {
            self.execution_ms += now.since(since).as_millis() as u64;
        }
    }

    /// Moves to a terminal state. `completed_at` is never earlier than `created_at`.
    pub(super) fn complete(&mut self, status: RunStatus, now: Timestamp) {
        debug_assert!(status.is_terminal());
        self.status = status;
        self.completed_at = Some(now.max(self.created_at));
        self.due_at = None;
        self.lease = None;
        self.stop_clock(now);
        let snapshot = self.snapshot();
        let data = match status {
            RunStatus::Succeeded => EventData::RunSucceeded(snapshot),
            RunStatus::Canceled => EventData::RunCanceled(snapshot),
            _ => EventData::RunFailed(snapshot),
        };
        self.record(now, data);
    }

    pub(super) fn requeue(&mut self, now: Timestamp, policy: &ExecutionPolicy) {
        self.stop_clock(now);
        self.status = RunStatus::Queued;
        self.lease = None;
        self.resends = 0;
        self.due_at = Some(now.plus(policy.requeue_after));
    }

    /// The sweeper sends a queued run again: a run that merely waits behind
    /// a backlog is sent again ever more rarely (1, 2, 4 ... 32 times
    /// `requeue_after`), so a backlog does not multiply its own messages.
    pub(super) fn resend(&mut self, now: Timestamp, policy: &ExecutionPolicy) {
        let wait = policy.requeue_after.saturating_mul(1 << self.resends.min(MAX_RESEND_DOUBLINGS));
        self.resends = self.resends.saturating_add(1);
        self.due_at = Some(now.plus(wait));
    }

    pub fn cancel(&mut self, now: Timestamp) -> Result<Changed, TransitionError> {
        match self.status {
            RunStatus::Canceled => Ok(Changed::No),
            RunStatus::Succeeded | RunStatus::Failed => Err(TransitionError::InvalidState(self.status)),
            RunStatus::Queued | RunStatus::Running | RunStatus::AwaitingApproval => {
                self.cancel_pending_approvals(now.max(self.created_at));
                self.complete(RunStatus::Canceled, now);
                Ok(Changed::Yes)
            }
        }
    }
}

impl RunSnapshot {
    pub fn of(run: &Run) -> Self {
        RunSnapshot {
            id: run.id,
            status: run.status,
            agent: run.agent.clone(),
            input: EventText::new(&run.input),
            output: run.output.as_deref().map(EventText::new),
            error: run.error.as_deref().map(EventText::new),
            approvals: ApprovalSummary::all_of(&run.approvals),
            metadata: run.metadata.clone(),
            created_by: run.created_by,
            created_at: run.created_at,
            started_at: run.started_at,
            completed_at: run.completed_at,
            usage: run.usage,
            budget: run.budget,
            thread: run.thread,
            trace_id: run.trace().trace_id,
        }
    }

    /// Whether the snapshot leaves something of the run out: a text cut, or
    /// an approval's arguments.
    pub fn truncated(&self) -> bool {
        let texts = [Some(&self.input), self.output.as_ref(), self.error.as_ref()];
        texts.into_iter().flatten().any(|text| text.truncated)
            || self.approvals.iter().any(|approval| approval.action.truncated || approval.tool.is_some())
    }
}
