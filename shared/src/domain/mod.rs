//! The pure core: runs, approvals, ids, field rules and the state machine.
//! Knows nothing of HTTP, AWS or SQLite.

mod agent;
mod approval;
mod cursor;
mod event;
mod fields;
mod ids;
mod run;
mod scope;
mod time;

#[cfg(test)]
mod run_tests;

pub use agent::*;
pub use approval::*;
pub use cursor::{Cursor, CursorError, InboxCursor, InboxPosition};
pub use event::*;
pub use fields::*;
pub use ids::{ApprovalId, EventId, IdGenerator, InvalidOwner, KeyId, MalformedId, Owner, RunId};
pub use run::*;
pub use scope::{Scope, Scopes};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
