//! The database's schema, one migration per version, applied in order.

use rusqlite::{Connection, TransactionBehavior};

use agent_runs_ports::store::StoreError;

use crate::unavailable;

pub(super) const SCHEMA: &str = "
CREATE TABLE runs (
    owner   TEXT    NOT NULL,
    id      TEXT    NOT NULL,
    status  TEXT    NOT NULL,
    version INTEGER NOT NULL,
    due_at  INTEGER,
    body    TEXT    NOT NULL,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE INDEX runs_by_status ON runs (owner, status, id);
CREATE INDEX runs_by_due ON runs (due_at, owner, id) WHERE due_at IS NOT NULL;
CREATE TABLE idempotency (
    owner        TEXT    NOT NULL,
    key_hash     TEXT    NOT NULL,
    request_hash TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (owner, key_hash)
) WITHOUT ROWID;
CREATE TABLE api_keys (
    id         TEXT    PRIMARY KEY,
    hash       BLOB    NOT NULL UNIQUE,
    owner      TEXT    NOT NULL,
    name       TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
";

/// Version 2: operator-defined agents.
pub(super) const SCHEMA_2: &str = "
CREATE TABLE agents (
    name       TEXT    PRIMARY KEY,
    definition TEXT    NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 3: each owner's count of active runs, kept by triggers so that no
/// write path can forget it. Counting the rows instead in every create's
/// transaction cost more the longer the queue grew (docs/benchmarks.md).
pub(super) const SCHEMA_3: &str = "
CREATE TABLE active_runs (
    owner TEXT    PRIMARY KEY,
    count INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO active_runs (owner, count)
    SELECT owner, COUNT(*) FROM runs WHERE status IN ('queued', 'running', 'awaiting_approval') GROUP BY owner;
CREATE TRIGGER runs_active_on_insert AFTER INSERT ON runs
    WHEN NEW.status IN ('queued', 'running', 'awaiting_approval')
BEGIN
    INSERT INTO active_runs (owner, count) VALUES (NEW.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET count = count + 1;
END;
CREATE TRIGGER runs_active_on_end AFTER UPDATE OF status ON runs
    WHEN OLD.status IN ('queued', 'running', 'awaiting_approval')
     AND NEW.status NOT IN ('queued', 'running', 'awaiting_approval')
BEGIN
    UPDATE active_runs SET count = count - 1 WHERE owner = OLD.owner;
END;
CREATE TRIGGER runs_active_on_delete AFTER DELETE ON runs
    WHEN OLD.status IN ('queued', 'running', 'awaiting_approval')
BEGIN
    UPDATE active_runs SET count = count - 1 WHERE owner = OLD.owner;
END;
";

/// Version 4: expired idempotency records are purged as new ones come in.
pub(super) const SCHEMA_4: &str = "
CREATE INDEX idempotency_by_expiry ON idempotency (expires_at);
";

/// Version 5: run events, written in the transaction of the change they
/// report.
pub(super) const SCHEMA_5: &str = "
CREATE TABLE run_events (
    run_id     TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    type       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    data       TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
";

/// Version 6: key scopes, space-separated names; NULL (keys from before,
/// and keys made without `--scope`) is every scope.
pub(super) const SCHEMA_6: &str = "
ALTER TABLE api_keys ADD COLUMN scopes TEXT;
";

/// Version 7: the approvals inbox, one row per approval with what it is
/// listed and ordered by, kept in the transaction of every write that
/// changes an approval's status; filled from the runs already stored.
pub(super) const SCHEMA_7: &str = "
CREATE TABLE approvals (
    owner        TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    approval_id  TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    agent        TEXT    NOT NULL,
    requested_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, approval_id)
) WITHOUT ROWID;
CREATE INDEX approvals_by_status ON approvals (owner, status, requested_at, run_id, approval_id);
CREATE INDEX approvals_by_agent ON approvals (owner, agent, status, requested_at, run_id, approval_id);
INSERT INTO approvals (owner, run_id, approval_id, status, agent, requested_at)
    SELECT runs.owner, runs.id, json_extract(approval.value, '$.id'), json_extract(approval.value, '$.status'),
           json_extract(runs.body, '$.agent'), json_extract(approval.value, '$.requested_at')
    FROM runs, json_each(runs.body, '$.approvals') AS approval;
";

/// Version 8: webhook endpoints, the outbox of their deliveries (a row per
/// endpoint and event, written in the event's transaction) and the record
/// of attempts.
pub(super) const SCHEMA_8: &str = "
CREATE TABLE webhooks (
    id              TEXT    PRIMARY KEY,
    owner           TEXT    NOT NULL,
    url             TEXT    NOT NULL,
    events          TEXT    NOT NULL,
    description     TEXT,
    status          TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    secret          TEXT    NOT NULL,
    previous_secrets TEXT   NOT NULL,
    failing_since   INTEGER
) WITHOUT ROWID;
CREATE INDEX webhooks_by_owner ON webhooks (owner, status, id);
CREATE INDEX webhooks_by_status ON webhooks (status, id);
CREATE TABLE webhook_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id      TEXT    NOT NULL,
    run_id          TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL
);
CREATE INDEX webhook_outbox_by_webhook ON webhook_outbox (webhook_id, next_attempt_at, id);
CREATE INDEX webhook_outbox_by_run ON webhook_outbox (run_id);
CREATE TABLE webhook_attempts (
    webhook_id  TEXT    NOT NULL,
    id          TEXT    NOT NULL,
    event_id    TEXT    NOT NULL,
    type        TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    http_status INTEGER,
    error       TEXT,
    duration_ms INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    PRIMARY KEY (webhook_id, id)
) WITHOUT ROWID;
";

/// Events' data as a stored record, rendered when read; the rows from
/// before hold their JSON as clients got it (format 1).
pub(super) const SCHEMA_9: &str = "ALTER TABLE run_events ADD COLUMN format INTEGER NOT NULL DEFAULT 1;";

/// Approval policies, and the history of the tool calls people decided
/// that a policy is tried on (filled from the runs already stored).
pub(super) const SCHEMA_10: &str = "
CREATE TABLE policies (
    owner    TEXT    PRIMARY KEY,
    version  INTEGER NOT NULL,
    document TEXT    NOT NULL
) WITHOUT ROWID;
CREATE TABLE decisions (
    owner       TEXT    NOT NULL,
    run_id      TEXT    NOT NULL,
    approval_id TEXT    NOT NULL,
    resolved_at INTEGER NOT NULL,
    agent       TEXT    NOT NULL,
    tool        TEXT    NOT NULL,
    arguments   TEXT    NOT NULL,
    decision    TEXT    NOT NULL,
    PRIMARY KEY (run_id, approval_id)
) WITHOUT ROWID;
CREATE INDEX decisions_by_owner ON decisions (owner, resolved_at, run_id, approval_id);
INSERT INTO decisions (owner, run_id, approval_id, resolved_at, agent, tool, arguments, decision)
    SELECT runs.owner, runs.id, json_extract(approval.value, '$.id'), json_extract(approval.value, '$.resolved_at'),
           json_extract(runs.body, '$.agent'), json_extract(approval.value, '$.tool'),
           json_extract(approval.value, '$.arguments'),
           CASE WHEN json_extract(approval.value, '$.status') = 'rejected' THEN 'rejected'
                WHEN json_extract(approval.value, '$.edited_arguments') IS NOT NULL THEN 'edited'
                ELSE 'approved' END
    FROM runs, json_each(runs.body, '$.approvals') AS approval
    WHERE json_extract(approval.value, '$.tool') IS NOT NULL
      AND json_extract(approval.value, '$.arguments') IS NOT NULL
      AND json_extract(approval.value, '$.resolved_at') IS NOT NULL
      AND substr(json_extract(approval.value, '$.resolved_by'), 1, 4) = 'key_'
      AND json_extract(approval.value, '$.status') IN ('approved', 'rejected');
";

/// The inbox's kind filter: each approval's kind (before questions, a
/// tool call or an action).
pub(super) const SCHEMA_11: &str = "
ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'action';
UPDATE approvals SET kind = 'tool_call' WHERE EXISTS (
    SELECT 1 FROM runs, json_each(runs.body, '$.approvals') AS approval
    WHERE runs.owner = approvals.owner AND runs.id = approvals.run_id
      AND json_extract(approval.value, '$.id') = approvals.approval_id
      AND json_extract(approval.value, '$.tool') IS NOT NULL);
";

/// Conversations: a continuation's thread (its first run has none: it is
/// found by its id), and the checkpoint an ended run ended with, apart from
/// the body lists read.
pub(super) const SCHEMA_12: &str = "
ALTER TABLE runs ADD COLUMN thread_id TEXT;
ALTER TABLE runs ADD COLUMN ended_checkpoint TEXT;
CREATE INDEX runs_by_thread ON runs (owner, thread_id, id) WHERE thread_id IS NOT NULL;
";

/// Schema version N is reached by running the first N steps, in order.
pub(super) const MIGRATIONS: [&str; 12] = [
    SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6, SCHEMA_7, SCHEMA_8, SCHEMA_9, SCHEMA_10, SCHEMA_11,
    SCHEMA_12,
];

pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(super) fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(unavailable)?;
    let version: i64 = transaction.query_row("PRAGMA user_version", [], |row| row.get(0)).map_err(unavailable)?;
    let pending = usize::try_from(version).ok().and_then(|version| MIGRATIONS.get(version..)).ok_or_else(|| {
        StoreError::Defect(format!(
            "the database has schema version {version}, newer than this build knows ({SCHEMA_VERSION})"
        ))
    })?;
    for step in pending {
        transaction.execute_batch(step).map_err(unavailable)?;
    }
    transaction.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(unavailable)?;
    transaction.commit().map_err(unavailable)
}
