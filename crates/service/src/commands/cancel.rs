//! Cancel: a run not ended yet ends as `canceled`.

use agent_runs_domain::{Changed, Owner, Run, RunId, TransitionError};
use agent_runs_ports::store::{ChangeError, Transition, change_run};

use super::RunCommands;

impl RunCommands {
    pub async fn cancel(&self, owner: &Owner, run_id: RunId) -> Result<Run, ChangeError<TransitionError>> {
        let (run, ()) = change_run(self.runs.as_ref(), owner, run_id, None, |run| {
            run.cancel(self.clock.now()).map(|changed| Transition::write_if(changed == Changed::Yes, ()))
        })
        .await?;
        Ok(run)
    }
}
