//! Extend: a pending approval gets more time. An approval found past its
//! time expires instead (and the run fails): extending never revives one.

use std::time::Duration;

use agent_runs_domain::{ApprovalId, ApprovalStatus, Changed, Run, RunId, TransitionError};
use agent_runs_ports::store::{ChangeError, Transition, change_run};

use super::{DecideRefused, RunCommands};
use crate::auth::Principal;

impl RunCommands {
    /// Moves the approval's expiry to `by` from now.
    pub async fn extend(
        &self,
        decider: &Principal,
        run_id: RunId,
        approval_id: ApprovalId,
        by: Duration,
    ) -> Result<Run, ChangeError<DecideRefused>> {
        let read = self.run_to_decide(decider, run_id).await?;
        self.check_separate_approver(decider, &read).await?;
        let owner = read.owner.clone();
        let (run, extended) = change_run(self.runs.as_ref(), &owner, run_id, Some(read), |run| {
            let now = self.clock.now();
            if run.expire_if_due(approval_id, now, &self.policy) {
                return Ok(Transition::Write(false));
            }
            // Its veto window is over: the sweeper approves it.
            if run.clone().auto_approve_if_due(approval_id, now, &self.policy).is_some() {
                return Err(DecideRefused::Transition(TransitionError::ApprovalAlreadyResolved(
                    ApprovalStatus::Approved,
                )));
            }
            let changed = run.extend_approval(approval_id, by, now, &self.policy).map_err(DecideRefused::Transition)?;
            Ok(Transition::write_if(changed == Changed::Yes, true))
        })
        .await?;
        if extended { Ok(run) } else { Err(ChangeError::Refused(DecideRefused::Expired)) }
    }
}
