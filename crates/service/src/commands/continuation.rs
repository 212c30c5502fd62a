//! A run that continues an ended one (`previous_run_id`): the owner's
//! run, by the same agent, ended; the new run starts from its state.

use agent_runs_domain::{Owner, Run, RunId, RunStatus};
use agent_runs_ports::store::StoreError;

use super::RunCommands;

/// Why a run cannot be continued, in the order the contract checks.
#[derive(Debug)]
pub enum ContinueRefused {
    /// No run of the owner's has that id.
    NotFound,
    /// The new run names another agent than the one that ran it.
    OtherAgent { asked: String, ran: String },
    /// It has not ended.
    NotEnded(RunStatus),
}

impl RunCommands {
    /// The ended run `run_id` of `owner`, to continue with `agent` when
    /// one is named.
    pub(super) async fn run_to_continue(
        &self,
        owner: &Owner,
        run_id: RunId,
        agent: Option<&str>,
    ) -> Result<Result<Run, ContinueRefused>, StoreError> {
        let Some(previous) = self.runs.get_to_continue(owner, run_id).await? else {
            return Ok(Err(ContinueRefused::NotFound));
        };
        if let Some(agent) = agent
            && agent != previous.agent
        {
            return Ok(Err(ContinueRefused::OtherAgent { asked: agent.to_owned(), ran: previous.agent }));
        }
        if !previous.status.is_terminal() {
            return Ok(Err(ContinueRefused::NotEnded(previous.status)));
        }
        Ok(Ok(previous))
    }
}
