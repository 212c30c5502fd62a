//! The inbox: approvals waiting for a person, across an owner's runs,
//! each with where it sits in the list.

use crate::approval::{Approval, ApprovalStatus};
use crate::cursor::InboxPosition;
use crate::ids::{ApprovalId, RunId};
use crate::run::Run;
use crate::run_values::RunStatus;

/// An approval with what the inbox shows of its run.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    pub approval: Approval,
    pub run_id: RunId,
    pub agent: String,
    pub run_status: RunStatus,
}

impl InboxEntry {
    /// The entry of `run`'s approval `approval_id` when it has `status` and
    /// comes after `after`: what both stores show for an index entry, read
    /// back from the run as it is now (an index may lag behind it).
    pub fn of(
        run: &Run,
        approval_id: ApprovalId,
        status: ApprovalStatus,
        after: Option<&InboxPosition>,
    ) -> Option<InboxEntry> {
        let approval = run.approvals.iter().find(|approval| approval.id == approval_id && approval.status == status)?;
        let entry =
            InboxEntry { approval: approval.clone(), run_id: run.id, agent: run.agent.clone(), run_status: run.status };
        after.is_none_or(|after| entry.position() < *after).then_some(entry)
    }

    pub fn position(&self) -> InboxPosition {
        InboxPosition { requested_at: self.approval.requested_at, run_id: self.run_id, approval_id: self.approval.id }
    }
}
