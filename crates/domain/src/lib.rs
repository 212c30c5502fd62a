//! The pure core: runs, approvals, ids, field rules and the state machine.
//! Knows nothing of HTTP, AWS or SQLite.

mod agent;
mod approval;
mod cursor;
mod event;
mod fields;
mod ids;
mod inbox;
mod mcp;
mod policy;
mod policy_replay;
mod question;
mod run;
mod run_values;
mod schema;
mod scope;
mod time;
mod trace;
mod webhook;

pub use agent::*;
pub use approval::*;
pub use cursor::{Cursor, CursorError, IdCursor, InboxCursor, InboxPosition};
pub use event::*;
pub use fields::*;
pub use ids::{
    ApprovalId, DeliveryId, EventId, IdGenerator, InvalidOwner, KeyId, MalformedId, Owner, RunId, WebhookId,
};
pub use inbox::InboxEntry;
pub use mcp::*;
pub use policy::*;
pub use policy_replay::{DecidedCall, HumanDecision, MAX_DISAGREEMENTS, Replay, ReplayStopped, RuleTally, replay};
pub use question::*;
pub use run::*;
pub use run_values::{Budget, RunStatus, ThreadLink, Usage};
pub use schema::{CompiledSchema, MAX_SCHEMA_PATTERNS, compile_kept_schema, compile_listed_schema, compile_schema};
pub use scope::{Scope, Scopes};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use trace::{RunTrace, SpanParent, new_span_id, new_trace_id};
pub use webhook::*;
