//! The run commands: what changes a run, by the contract's rules, whoever
//! asks (the HTTP API today; chat channels and A2A are other ways in).
//! One file per command holds its whole rule: create (with continuation),
//! cancel, decide (with the answer's check), extend and the batch. `api/`
//! parses a request into one of these calls and answers with what it
//! returns; nothing here knows HTTP.

mod answer;
mod batch;
mod cancel;
mod continuation;
mod create;
mod decide;
mod extend;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{ApprovalKind, Clock, ExecutionPolicy, IdGenerator, Run, RunId, Timestamp, TransitionError};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{RunMessage, RunQueue};
use agent_runs_ports::store::{ChangeError, RunStore, Transition};

pub use batch::{BatchDecision, BatchRefused};
pub use continuation::ContinueRefused;
pub use create::{Accepted, IDEMPOTENCY_WINDOW, NewRun, StartError, Started};

use crate::auth::Principal;

/// What the commands work with: the runs and their queue, the agents
/// (their rules for input, budgets, approvers and edits), the clock.
pub struct RunCommands {
    runs: Arc<dyn RunStore>,
    queue: Arc<dyn RunQueue>,
    agents: AgentRegistry,
    clock: Arc<dyn Clock>,
    ids: IdGenerator,
    policy: ExecutionPolicy,
    max_active_runs: u32,
    /// Runs (at a version) sent for their decisions, and when (see
    /// [`RunCommands::send_decided`]).
    recent_sends: Mutex<HashMap<(RunId, u64), Timestamp>>,
}

/// A run is sent again for a repeated decision at most this often by one
/// process: repeating a decision cannot flood the queue.
const RESEND_SPACING: Duration = Duration::from_secs(10);
/// Sends remembered; beyond it, those past their spacing are forgotten
/// (all of them if none is).
const RECENT_SENDS_CAPACITY: usize = 10_000;

/// Why a decision (or an extension) was not recorded.
#[derive(Debug)]
pub enum DecideRefused {
    /// The approval had expired: it is now, and the run has failed.
    Expired,
    Transition(TransitionError),
    /// The run's agent wants its approvals decided by another key than the
    /// one that created the run (`separate_approver`).
    SameKeyAsCreator {
        agent: String,
    },
    /// An edit of an approval that has no call to edit.
    NothingToEdit(ApprovalKind),
    /// Edited arguments the tool's schema refuses.
    ArgumentsRefused(String),
}

impl RunCommands {
    pub fn new(
        runs: Arc<dyn RunStore>,
        queue: Arc<dyn RunQueue>,
        agents: AgentRegistry,
        clock: Arc<dyn Clock>,
        policy: ExecutionPolicy,
        max_active_runs: u32,
    ) -> Self {
        RunCommands {
            runs,
            queue,
            agents,
            clock,
            ids: IdGenerator::default(),
            policy,
            max_active_runs,
            recent_sends: Mutex::default(),
        }
    }

    /// One of the owner's runs, to decide on.
    async fn run_to_decide(&self, by: &Principal, run_id: RunId) -> Result<Run, ChangeError<DecideRefused>> {
        self.runs.get(&by.owner, run_id).await?.ok_or(ChangeError::Gone)
    }

    /// A defined agent with `separate_approver` wants another key than the
    /// one that created the run to act on its approvals.
    async fn check_separate_approver(&self, by: &Principal, run: &Run) -> Result<(), ChangeError<DecideRefused>> {
        if run.created_by == Some(by.key_id) && self.agents.requires_separate_approver(&run.agent).await? {
            return Err(ChangeError::Refused(DecideRefused::SameKeyAsCreator { agent: run.agent.clone() }));
        }
        Ok(())
    }

    /// Sends a run its decisions resumed. `spaced`: the decisions were made
    /// by another request (whose answer may have been lost), and the run is
    /// not sent when this process sent it moments ago at this version (a new
    /// park is a new version): repeating a decision cannot flood the queue.
    async fn send_decided(&self, run: &Run, spaced: bool) {
        let now = self.clock.now();
        let key = (run.id, run.version);
        let sent_lately =
            || agent_runs_ports::lock(&self.recent_sends).get(&key).is_some_and(|at| now.since(*at) < RESEND_SPACING);
        if (spaced && sent_lately()) || !self.send_resumed(run).await {
            return;
        }
        let mut sent = agent_runs_ports::lock(&self.recent_sends);
        if sent.len() >= RECENT_SENDS_CAPACITY {
            sent.retain(|_, at| now.since(*at) < RESEND_SPACING);
            if sent.len() >= RECENT_SENDS_CAPACITY {
                sent.clear();
            }
        }
        sent.insert(key, now);
    }

    /// Queues a run its last decision resumed; should the send fail, the
    /// sweeper sends it. Whether it was sent.
    async fn send_resumed(&self, run: &Run) -> bool {
        let message = RunMessage { run_id: run.id, owner: run.owner.clone() };
        match self.queue.enqueue(&message).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(run_id = %run.id, error = %error_chain(&error), "enqueue after the last decision failed; the sweeper will retry");
                false
            }
        }
    }
}

/// Whether a write of a read-change-write may have landed though the
/// caller did not see it succeed: it was tried, and the loop then started
/// over (after a conflict, which a write whose answer was lost also gives).
#[derive(Default)]
struct WritesSeen {
    tried: bool,
    may_have_landed: bool,
}

impl WritesSeen {
    /// At the start of each round of the loop.
    fn next_attempt(&mut self) {
        self.may_have_landed |= self.tried;
    }

    fn note<T>(&mut self, transition: Transition<T>) -> Transition<T> {
        self.tried |= matches!(transition, Transition::Write(_));
        transition
    }
}
