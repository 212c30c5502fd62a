//! Lists, events and the sweeper's reads.

use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};
use tokio::sync::watch;

use agent_runs_domain::{ApprovalKind, Owner, RunId, Timestamp};
use agent_runs_ports::store::{
    DueRun, EventLog, EventPage, InboxEntry, InboxPage, InboxRequest, InboxViewPage, ListPage, ListRequest, RunKey,
    RunLists, RunStore, Settled, StoreError, StoredEvent, Upkeep, ViewPage, inbox_views_of, run_view_json,
};

use crate::{EVENT_COLUMNS, EVENT_SIGNALS_KEPT, EventRow, SqliteStore, decode_run, event_row, list_rows, unavailable};

#[async_trait]
impl RunLists for SqliteStore {
    async fn list(&self, owner: &Owner, request: ListRequest) -> Result<ListPage, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            let bodies = list_rows(connection, &owner, request, |row| row.get::<_, String>(2))?;
            let has_more = bodies.len() > request.limit as usize;
            let runs =
                bodies.iter().take(request.limit as usize).map(|body| decode_run(body)).collect::<Result<_, _>>()?;
            Ok(ListPage { runs, has_more, resume_after: None })
        })
        .await
    }

    /// A page read since the owner's last write is answered as kept. Runs
    /// written lately are in the cache with their JSON made once; only the
    /// others are decoded and encoded (after the reader is free).
    async fn list_views(&self, owner: &Owner, request: ListRequest) -> Result<ViewPage, StoreError> {
        let generation = match self.inner.recent.as_ref().map(|recent| recent.page(owner, &request)) {
            Some(Ok(page)) => return Ok(page),
            Some(Err(generation)) => Some(generation),
            None => None,
        };
        let inner = self.inner.clone();
        let rows_owner = owner.clone();
        let rows = self
            .read(move |connection| {
                let owner = rows_owner;
                list_rows(connection, &owner.to_string(), request, |row| {
                    let id: String = row.get(0)?;
                    let version: i64 = row.get(1)?;
                    let cached = id
                        .parse::<RunId>()
                        .ok()
                        .and_then(|run_id| inner.recent.as_ref()?.get(&owner, run_id))
                        .filter(|recent| recent.run.version as i64 == version);
                    Ok(match cached {
                        Some(recent) => Ok(recent),
                        None => Err(row.get::<_, String>(2)?),
                    })
                })
            })
            .await?;
        let has_more = rows.len() > request.limit as usize;
        let mut views = Vec::with_capacity(request.limit as usize);
        let mut last = None;
        for row in rows.into_iter().take(request.limit as usize) {
            let (id, view) = match row {
                Ok(recent) => (recent.run.id, recent.view(self.shown)?),
                Err(body) => {
                    let run = decode_run(&body)?;
                    (run.id, run_view_json(&run, self.shown)?)
                }
            };
            views.push(view);
            last = Some(id);
        }
        let page = ViewPage { views, last, has_more };
        Ok(match (&self.inner.recent, generation) {
            (Some(recent), Some(generation)) => recent.keep_page(owner, request, generation, page),
            _ => page,
        })
    }

    async fn run_json(&self, owner: &Owner, run_id: RunId) -> Result<Option<Arc<str>>, StoreError> {
        if let Some(recent) = self.inner.recent.as_ref().and_then(|recent| recent.get(owner, run_id)) {
            return recent.view(self.shown).map(Some);
        }
        self.get(owner, run_id).await?.map(|run| run_view_json(&run, self.shown)).transpose()
    }

    /// A page read since the owner's last write is answered as kept.
    async fn inbox_views(&self, owner: &Owner, request: InboxRequest) -> Result<InboxViewPage, StoreError> {
        let Some(recent) = &self.inner.recent else {
            return inbox_views_of(self.inbox(owner, request).await?);
        };
        let generation = match recent.inbox_page(owner, &request) {
            Ok(page) => return Ok(page),
            Err(generation) => generation,
        };
        let page = inbox_views_of(self.inbox(owner, request.clone()).await?)?;
        Ok(recent.keep_inbox_page(owner, request, generation, page))
    }

    async fn inbox(&self, owner: &Owner, request: InboxRequest) -> Result<InboxPage, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            // Every position sorts below this, so "no cursor" needs no second query shape.
            let after = request.after.map_or((i64::MAX, String::new(), String::new()), |after| {
                (after.requested_at.millis(), after.run_id.to_string(), after.approval_id.to_string())
            });
            let fetch = i64::from(request.limit) + 1;
            let status = request.status.as_str();
            let kind = request.kind.map(ApprovalKind::as_str);
            let row = |row: &rusqlite::Row<'_>| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?));
            let rows: Vec<(String, String)> = match &request.agent {
                None => connection
                    .prepare_cached(
                        "SELECT approvals.approval_id, runs.body FROM approvals
                         JOIN runs ON runs.owner = approvals.owner AND runs.id = approvals.run_id
                         WHERE approvals.owner = ?1 AND approvals.status = ?2
                           AND (approvals.requested_at, approvals.run_id, approvals.approval_id) < (?3, ?4, ?5)
                           AND (?7 IS NULL OR approvals.kind = ?7)
                         ORDER BY approvals.requested_at DESC, approvals.run_id DESC, approvals.approval_id DESC
                         LIMIT ?6",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_map(params![owner, status, after.0, after.1, after.2, fetch, kind], row)?
                            .collect()
                    }),
                Some(agent) => connection
                    .prepare_cached(
                        "SELECT approvals.approval_id, runs.body FROM approvals
                         JOIN runs ON runs.owner = approvals.owner AND runs.id = approvals.run_id
                         WHERE approvals.owner = ?1 AND approvals.agent = ?2 AND approvals.status = ?3
                           AND (approvals.requested_at, approvals.run_id, approvals.approval_id) < (?4, ?5, ?6)
                           AND (?8 IS NULL OR approvals.kind = ?8)
                         ORDER BY approvals.requested_at DESC, approvals.run_id DESC, approvals.approval_id DESC
                         LIMIT ?7",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_map(params![owner, agent, status, after.0, after.1, after.2, fetch, kind], row)?
                            .collect()
                    }),
            }
            .map_err(unavailable)?;
            let has_more = rows.len() > request.limit as usize;
            let mut entries = Vec::with_capacity(rows.len());
            for (approval_id, body) in rows.iter().take(request.limit as usize) {
                let run = decode_run(body)?;
                let approval_id =
                    approval_id.parse().map_err(|_| StoreError::Defect("malformed approval id in the inbox".into()))?;
                // Rows change in the transaction of the run, so they agree;
                // one that did not would be left out, not fail the page.
                match InboxEntry::of(&run, approval_id, request.status, None) {
                    Some(entry) => entries.push(entry),
                    None => tracing::error!(run_id = %run.id, %approval_id, "an inbox row disagrees with its run"),
                }
            }
            Ok(InboxPage { entries, has_more, resume_after: None })
        })
        .await
    }
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn events(&self, run_id: RunId, after: u64, limit: u32) -> Result<EventPage, StoreError> {
        self.read(move |connection| {
            let fetch = i64::from(limit) + 1;
            let rows: Vec<EventRow> = connection
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM run_events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
                ))
                .and_then(|mut statement| {
                    statement
                        .query_map(params![run_id.to_string(), after.min(i64::MAX as u64) as i64, fetch], |row| {
                            event_row(row, 0)
                        })?
                        .collect()
                })
                .map_err(unavailable)?;
            let mut events: Vec<StoredEvent> = rows.into_iter().map(StoredEvent::from).collect();
            let has_more = events.len() > limit as usize;
            events.truncate(limit as usize);
            Ok(EventPage { events, has_more })
        })
        .await
    }

    async fn event(&self, run_id: RunId, seq: u64) -> Result<Option<StoredEvent>, StoreError> {
        let (run_id, seq) = (run_id.to_string(), seq.min(i64::MAX as u64) as i64);
        self.read(move |connection| {
            connection
                .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM run_events WHERE run_id = ?1 AND seq = ?2"))
                .and_then(|mut statement| statement.query_row(params![run_id, seq], |row| event_row(row, 0)).optional())
                .map_err(unavailable)
                .map(|row| row.map(StoredEvent::from))
        })
        .await
    }

    fn event_signal(&self, run_id: RunId) -> Option<watch::Receiver<u64>> {
        let mut signals = agent_runs_ports::lock(&self.inner.event_signals);
        if signals.len() >= EVENT_SIGNALS_KEPT && !signals.contains_key(&run_id) {
            signals.retain(|_, signal| signal.receiver_count() > 0);
        }
        Some(signals.entry(run_id).or_insert_with(|| watch::channel(0).0).subscribe())
    }
}

#[async_trait]
impl Upkeep for SqliteStore {
    async fn due(&self, until: Timestamp, after: Option<&DueRun>, limit: u32) -> Result<Vec<DueRun>, StoreError> {
        let after = after.map(|due| (due.due_at.millis(), due.key.owner.to_string(), due.key.run_id.to_string()));
        self.read(move |connection| {
            let mut cursor = after.unwrap_or((i64::MIN, String::new(), String::new()));
            let mut statement = connection
                .prepare_cached(
                    "SELECT due_at, owner, id FROM runs
                     WHERE due_at IS NOT NULL AND due_at <= ?1 AND (due_at, owner, id) > (?2, ?3, ?4)
                     ORDER BY due_at, owner, id LIMIT ?5",
                )
                .map_err(unavailable)?;
            // A malformed row is left out and does not count, so the page
            // still holds `limit` runs when there are that many.
            let mut found = Vec::new();
            loop {
                let rows = statement
                    .query_map(params![until.millis(), cursor.0, cursor.1, cursor.2, limit], |row| {
                        Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?, row.get::<_, String>(2)?))
                    })
                    .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                    .map_err(unavailable)?;
                let last_rows = rows.len() < limit as usize;
                for (due_at, owner, id) in rows {
                    match (Owner::parse(&owner), id.parse()) {
                        (Ok(owner), Ok(run_id)) if found.len() < limit as usize => {
                            found
                                .push(DueRun { due_at: Timestamp::from_millis(due_at), key: RunKey { owner, run_id } });
                        }
                        (Ok(_), Ok(_)) => {}
                        _ => tracing::error!(owner, id, "a due run's key is malformed; the sweeper leaves it out"),
                    }
                    cursor = (due_at, owner, id);
                }
                if last_rows || found.len() >= limit as usize {
                    return Ok(found);
                }
            }
        })
        .await
    }

    async fn settle_counts(
        &self,
        _now: Timestamp,
        _deadline: Option<std::time::Instant>,
    ) -> Result<Settled, StoreError> {
        // The count is written with the runs: nothing to settle.
        Ok(Settled::default())
    }
}
