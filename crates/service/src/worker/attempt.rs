//! The worker's state for one claim of a run: what it holds between the
//! claim and the write that hands the run back, in one place.

use std::time::Instant;

use agent_runs_domain::{EventData, Run};

/// One claim of a run.
pub(super) struct Attempt {
    /// This claim's lease token: a new one for every claim, so a process
    /// whose earlier attempt died never mistakes the dead lease for its own.
    pub(super) lease: String,
    /// The run as last written or read.
    pub(super) run: Run,
    /// The agent's latest state, saved or not yet: whatever hands the run
    /// back hands this back, so nothing the agent did is done again.
    pub(super) checkpoint: Option<serde_json::Value>,
    /// When the last write that renewed the lease was sent (the claim's,
    /// at first): the lease runs from no later than this.
    pub(super) renewed_at: Instant,
    /// What the agent reported since the last write that carried events.
    /// Only a write that also saves the checkpoint covering them carries
    /// them, so an event is never written twice nor for work done again.
    pub(super) events: Vec<EventData>,
    /// The stored version a claim made in memory only was made on (see
    /// [`super::Worker`]'s claim): until a write bumps it, nothing of the attempt
    /// is stored.
    pub(super) claimed_unwritten_at: Option<u64>,
}

impl Attempt {
    pub(super) fn claim_unwritten(&self) -> bool {
        self.claimed_unwritten_at == Some(self.run.version)
    }
}
