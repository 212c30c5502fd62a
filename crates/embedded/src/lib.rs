//! The embedded store: one SQLite file in WAL mode.
//!
//! Runs are kept as JSON documents beside the columns that are queried
//! (status, due time, version), mirroring the DynamoDB item design. A
//! committed transaction survives a kill -9 of the process: with WAL and
//! `synchronous=NORMAL` the commit is in the WAL file before `insert`
//! returns; only a power loss can drop the last commits, which
//! `synchronous=FULL` ([`Durability::Full`]) prevents at the cost of an fsync
//! per write.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, params};

use tokio::sync::watch;

mod file_key;
mod keys;
mod policies;
mod reads;
mod recent;
mod runs;
mod schema;
mod webhooks;
mod writer;

pub use file_key::{LocalKey, previous_path};
use recent::RecentRuns;
use schema::migrate;
use writer::{Committed, Writer};

use agent_runs_domain::{ApprovalId, Event, EventData, Owner, RunId, Timestamp};
use agent_runs_ports::store::record::StoredRun;
use agent_runs_ports::store::{EventBody, EventFormat, ListRequest, Run, StoreError, StoredEvent};
use agent_runs_ports::views::ExtraFields;

const READERS: usize = 4;

/// Expired idempotency records removed by each create that adds one: more
/// than one, so the table shrinks back to the keys still in their window.
const PURGE_PER_CREATE: u32 = 16;
/// Records are purged only this long after they expired, so a clock that
/// jumps forward for a while cannot remove records still in their window.
const PURGE_AFTER: i64 = 60 * 60 * 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a crash of the process (kill -9); the default.
    #[default]
    Process,
    /// Also survives a power loss or OS crash: an fsync per commit.
    Full,
}

#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
    /// What the runs' JSON (lists, events) shows beyond the contract.
    shown: ExtraFields,
}

struct Inner {
    path: PathBuf,
    writer: Writer,
    readers: Vec<Mutex<Connection>>,
    /// Present when this process owns the database's runs.
    recent: Option<RecentRuns>,
    /// Held while serving: the lock that makes `recent` sound.
    _owner_lock: Option<std::fs::File>,
    /// The last event `seq` committed, per run somebody waits on.
    event_signals: Mutex<HashMap<RunId, watch::Sender<u64>>>,
    /// Told when a commit queued webhook deliveries.
    deliveries_queued: tokio::sync::Notify,
}

/// Signals kept before those nobody waits on any more are dropped.
const EVENT_SIGNALS_KEPT: usize = 1024;

fn unavailable(error: rusqlite::Error) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

fn open_connection(path: &Path, durability: Durability) -> Result<Connection, rusqlite::Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags)?;
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    // Plans never depend on bound values: without this, SQLite takes a
    // bound `LIMIT ?` for a value its plan may depend on and re-prepares the
    // statement at every bind, which took a quarter of a list's time.
    connection.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    connection.pragma_update(None, "journal_mode", "WAL")?;
    let synchronous = match durability {
        Durability::Process => "NORMAL",
        Durability::Full => "FULL",
    };
    connection.pragma_update(None, "synchronous", synchronous)?;
    Ok(connection)
}

/// Holds `<path>.lock` exclusively for as long as the file is open (the OS
/// lets go of it when the process dies).
fn take_owner_lock(path: &Path) -> std::io::Result<std::fs::File> {
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)?;
    if lock.try_lock().is_err() {
        return Err(std::io::Error::other(format!("another `agent-runs serve` is using {}", path.display())));
    }
    Ok(lock)
}

fn encode_run(run: &Run) -> Result<String, StoreError> {
    serde_json::to_string(&StoredRun::from(run))
        .map_err(|error| StoreError::Defect(format!("cannot encode run: {error}")))
}

/// A run's row: its body and, for an ended run, the checkpoint it ended
/// with, kept out of the body that gets and lists read.
struct RunRow {
    body: String,
    ended_checkpoint: Option<String>,
}

impl RunRow {
    fn of(run: &Run) -> Result<RunRow, StoreError> {
        if !run.status.is_terminal() || run.checkpoint.is_none() {
            return Ok(RunRow { body: encode_run(run)?, ended_checkpoint: None });
        }
        let ended_checkpoint = serde_json::to_string(&run.checkpoint)
            .map_err(|error| StoreError::Defect(format!("cannot encode checkpoint: {error}")))?;
        let body = encode_run(&Run { checkpoint: None, ..run.clone() })?;
        Ok(RunRow { body, ended_checkpoint: Some(ended_checkpoint) })
    }
}

fn decode_run(body: &str) -> Result<Run, StoreError> {
    serde_json::from_str::<StoredRun>(body)
        .map_err(|error| StoreError::Defect(format!("cannot decode stored run: {error}")))?
        .try_into()
}

impl SqliteStore {
    /// Opens (creating it and its folder if needed) the database at `path`.
    pub fn open(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        Self::open_with(path.as_ref(), durability, false)
    }

    /// Opens the database for the one process that executes its runs (the
    /// embedded server): takes `<path>.lock` so a second server on the same
    /// file is refused, and keeps recently written runs in memory.
    pub fn open_for_serving(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        Self::open_with(path.as_ref(), durability, true)
    }

    fn open_with(path: &Path, durability: Durability, serving: bool) -> Result<Self, StoreError> {
        let io_error = |error: std::io::Error| StoreError::Unavailable(Box::new(error));
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io_error)?;
        }
        let owner_lock = if serving { Some(take_owner_lock(path).map_err(io_error)?) } else { None };
        let mut writer = open_connection(path, durability).map_err(unavailable)?;
        migrate(&mut writer)?;
        let readers = (0..READERS)
            .map(|_| open_connection(path, durability).map(Mutex::new))
            .collect::<Result<_, _>>()
            .map_err(unavailable)?;
        let inner = Inner {
            path: path.to_path_buf(),
            writer: Writer::start(writer, open_connection(path, durability).map_err(unavailable)?).map_err(io_error)?,
            readers,
            recent: serving.then(RecentRuns::default),
            _owner_lock: owner_lock,
            event_signals: Mutex::default(),
            deliveries_queued: tokio::sync::Notify::new(),
        };
        Ok(Self { inner: Arc::new(inner), shown: ExtraFields::default() })
    }

    /// Renders runs in lists and events showing `shown` (what the
    /// deployment's configuration says; nothing beyond the contract unless
    /// told). Called right after opening, before any clone: the cache of
    /// recent runs' JSON is shared by the clones.
    pub fn showing(self, shown: ExtraFields) -> Self {
        SqliteStore { shown, ..self }
    }

    /// Tells the cache of recent runs, if any, about a committed removal.
    fn forget(&self, owner: &Owner, run_id: RunId) {
        if let Some(recent) = &self.inner.recent {
            recent.removed(owner, run_id);
        }
    }

    /// Tells the cache of recent runs, if any, about a committed write.
    fn remember(&self, run: Run, encoded_len: usize) {
        if let Some(recent) = &self.inner.recent {
            recent.written(run, encoded_len);
        }
    }

    /// After a commit of `runs` (each with its encoded size and whether it
    /// logged events): the cache first, so whoever a signal wakes reads the
    /// runs as committed, then the waiters on their events and, when the
    /// commit queued webhook deliveries, the outbox worker.
    fn runs_committed(&self, runs: impl IntoIterator<Item = (Run, usize, bool)>, deliveries_queued: bool) {
        let mut logged = Vec::new();
        for (run, encoded_len, with_events) in runs {
            if with_events {
                logged.push((run.id, run.event_seq));
            }
            self.remember(run, encoded_len);
        }
        for (run_id, last_seq) in logged {
            self.events_committed(run_id, last_seq);
        }
        if deliveries_queued {
            self.signal_deliveries_queued();
        }
    }

    /// Wakes whoever waits on the run's events: called after the commit.
    fn events_committed(&self, run_id: RunId, last_seq: u64) {
        let mut signals = agent_runs_ports::lock(&self.inner.event_signals);
        if let Some(signal) = signals.get(&run_id) {
            if signal.receiver_count() == 0 {
                signals.remove(&run_id);
            } else {
                signal.send_replace(last_seq);
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `work` in a write transaction (with the writes waiting beside
    /// it: [`writer`]) and answers once it is committed.
    async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut Committed) -> Result<T, StoreError> + Send + 'static,
    {
        self.inner.writer.write(work).await
    }

    async fn read<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        // A read on a free connection takes microseconds (WAL readers never
        // wait for the writer): do it in place, which is cheaper than the
        // hand-off to the blocking pool. Only when every reader is busy,
        // wait for one there rather than block the async runtime.
        if let Some(reader) = self.inner.readers.iter().find_map(|reader| reader.try_lock().ok()) {
            return work(&reader);
        }
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let reader = agent_runs_ports::lock(&inner.readers[0]);
            work(&reader)
        })
        .await
        .map_err(|error| StoreError::Defect(format!("store task failed: {error}")))?
    }
}

/// The rows (`id, version, body`) of a page of the owner's runs, newest
/// first, one more than the page holds (to tell whether more exist).
fn list_rows<T>(
    connection: &Connection,
    owner: &str,
    request: ListRequest,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    // Every run id sorts below this, so "no cursor" needs no second query shape.
    let before = request.before.map_or_else(|| "run_~".to_owned(), |id| id.to_string());
    let fetch = i64::from(request.limit) + 1;
    if let Some(thread) = request.thread {
        // The continuations by the thread index, and the first run by its id.
        return connection
            .prepare_cached(
                "SELECT id, version, body FROM (
                     SELECT * FROM (
                         SELECT id, version, body FROM runs
                         WHERE owner = ?1 AND thread_id = ?2 AND id < ?3 AND (?5 IS NULL OR status = ?5)
                         ORDER BY id DESC LIMIT ?4)
                     UNION ALL
                     SELECT id, version, body FROM runs
                     WHERE owner = ?1 AND id = ?2 AND thread_id IS NULL AND id < ?3 AND (?5 IS NULL OR status = ?5))
                 ORDER BY id DESC LIMIT ?4",
            )
            .and_then(|mut statement| {
                let status = request.status.map(|status| status.as_str());
                statement.query_map(params![owner, thread.to_string(), before, fetch, status], map)?.collect()
            })
            .map_err(unavailable);
    }
    match request.status {
        None => connection
            .prepare_cached("SELECT id, version, body FROM runs WHERE owner = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3")
            .and_then(|mut statement| statement.query_map(params![owner, before, fetch], map)?.collect()),
        Some(status) => connection
            .prepare_cached(
                "SELECT id, version, body FROM runs
                 WHERE owner = ?1 AND status = ?2 AND id < ?3 ORDER BY id DESC LIMIT ?4",
            )
            .and_then(|mut statement| {
                statement.query_map(params![owner, status.as_str(), before, fetch], map)?.collect()
            }),
    }
    .map_err(unavailable)
}

/// Returns the length of the stored body.
fn insert_run_row(connection: &Connection, run: &Run) -> Result<usize, StoreError> {
    let row = RunRow::of(run)?;
    connection
        .prepare_cached(
            "INSERT INTO runs (owner, id, status, version, due_at, body, thread_id, ended_checkpoint)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                run.owner.as_str(),
                run.id.to_string(),
                run.status.as_str(),
                run.version as i64,
                run.due_at.map(Timestamp::millis),
                &row.body,
                run.thread.map(|thread| thread.thread_id.to_string()),
                row.ended_checkpoint,
            ])
        })
        .map_err(unavailable)?;
    Ok(row.body.len())
}

/// Writes the run's events, and for each an outbox row per enabled
/// webhook endpoint of the owner that wants it; `true` when there were any.
fn insert_events(connection: &Connection, owner: &Owner, events: &[Event]) -> Result<bool, StoreError> {
    let mut statement = connection
        .prepare_cached(
            "INSERT INTO run_events (run_id, seq, type, created_at, data, format) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .map_err(unavailable)?;
    for event in events {
        // Always the record: a release from before it refuses this schema.
        let data = EventBody::written(&event.data, EventFormat::Record, ExtraFields::default());
        statement
            .execute(params![
                event.run_id.to_string(),
                event.seq as i64,
                event.data.kind(),
                event.at.millis(),
                data.text(),
                data.format()
            ])
            .map_err(unavailable)?;
    }
    webhooks::enqueue_deliveries(connection, owner, events)
}

/// An event as its row holds it: `seq, type, created_at, format, data`
/// from column `first` on.
fn event_row(row: &rusqlite::Row, first: usize) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        seq: row.get::<_, i64>(first)? as u64,
        kind: row.get(first + 1)?,
        at: Timestamp::from_millis(row.get(first + 2)?),
        // A format this release does not know fails where the event is shown.
        format: u8::try_from(row.get::<_, i64>(first + 3)?).unwrap_or(u8::MAX),
        data: row.get(first + 4)?,
    })
}

/// The columns [`event_row`] reads, in its order.
const EVENT_COLUMNS: &str =
    "run_events.seq, run_events.type, run_events.created_at, run_events.format, run_events.data";

struct EventRow {
    seq: u64,
    kind: String,
    at: Timestamp,
    format: u8,
    data: String,
}

impl From<EventRow> for StoredEvent {
    fn from(row: EventRow) -> Self {
        StoredEvent { seq: row.seq, kind: row.kind, at: row.at, data: EventBody::stored(row.format, row.data) }
    }
}

/// Brings the inbox rows of the approvals whose status `events` changed up
/// to date with `run`.
fn index_approvals(connection: &Connection, run: &Run, events: &[Event]) -> Result<(), StoreError> {
    let changed: Vec<ApprovalId> = events
        .iter()
        .filter_map(|event| match &event.data {
            EventData::ApprovalRequested(approval)
            | EventData::ApprovalDecided(approval)
            | EventData::ApprovalExpired(approval)
            | EventData::ApprovalCanceled(approval) => Some(approval.id),
            _ => None,
        })
        .collect();
    if changed.is_empty() {
        // Most writes (claims, heartbeats, finishes of runs without approvals).
        return Ok(());
    }
    let mut statement = connection
        .prepare_cached(
            "INSERT OR REPLACE INTO approvals (owner, run_id, approval_id, status, agent, requested_at, kind)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(unavailable)?;
    for approval in changed.into_iter().filter_map(|id| run.approvals.iter().find(|approval| approval.id == id)) {
        statement
            .execute(params![
                run.owner.as_str(),
                run.id.to_string(),
                approval.id.to_string(),
                approval.status.as_str(),
                run.agent,
                approval.requested_at.millis(),
                approval.kind().as_str()
            ])
            .map_err(unavailable)?;
    }
    policies::record_decisions(connection, run, events)
}

/// One run's write: the run as it is to be stored, on the condition that
/// the stored one is still at `expected`, with its events.
struct PendingUpdate {
    expected: u64,
    next: Run,
    events: Vec<Event>,
    row: RunRow,
}

impl PendingUpdate {
    /// `true` when webhook deliveries were queued.
    fn apply(&self, transaction: &Connection) -> Result<bool, StoreError> {
        let next = &self.next;
        let changed = transaction
            .prepare_cached(
                "UPDATE runs SET status = ?1, version = ?2, due_at = ?3, body = ?4, ended_checkpoint = ?8
                 WHERE owner = ?5 AND id = ?6 AND version = ?7 AND status IN ('queued', 'running', 'awaiting_approval')",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    next.status.as_str(),
                    next.version as i64,
                    next.due_at.map(Timestamp::millis),
                    &self.row.body,
                    next.owner.as_str(),
                    next.id.to_string(),
                    self.expected as i64,
                    self.row.ended_checkpoint,
                ])
            })
            .map_err(unavailable)?;
        if changed != 1 {
            return Err(StoreError::Conflict);
        }
        let queued = insert_events(transaction, &next.owner, &self.events)?;
        index_approvals(transaction, next, &self.events)?;
        Ok(queued)
    }
}
