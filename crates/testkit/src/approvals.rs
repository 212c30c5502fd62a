//! Approvals to build test cases from.

use agent_runs_domain::{Approval, ApprovalStatus, Timestamp};

/// A typical pending approval: an action (no call) put to a person, with no
/// decision, expiry, policy or veto window. A test sets what it needs:
/// `Approval { call: Some(call), ..pending_approval() }`.
pub fn pending_approval() -> Approval {
    Approval {
        // The ULID of (1_795_303_478_123 ms, 1): asked when its id says.
        id: "apr_01M806T4VB0000000000000001".parse().expect("a well-formed approval id"),
        action: "Deploy to production".into(),
        call: None,
        status: ApprovalStatus::Pending,
        requested_at: Timestamp::from_millis(1_795_303_478_123),
        resolved_at: None,
        comment: None,
        expires_at: None,
        expiry_warned: false,
        resolved_by: None,
        edited_arguments: None,
        policy: None,
        input_schema: None,
        answer: None,
        tool_changed: false,
        auto_approves_at: None,
    }
}
