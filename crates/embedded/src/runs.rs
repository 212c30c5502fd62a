//! One run at a time: create, read and change it.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use agent_runs_domain::{Owner, RunId};
use agent_runs_ports::store::{
    BatchWriteError, IdempotencyClaim, IdempotencyRecord, InsertOutcome, Run, RunStore, StoreError,
};

use crate::{
    PURGE_AFTER, PURGE_PER_CREATE, PendingUpdate, RunRow, SqliteStore, decode_run, insert_events, insert_run_row,
    unavailable,
};

#[async_trait]
impl RunStore for SqliteStore {
    async fn insert(
        &self,
        run: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
        max_active: u32,
    ) -> Result<InsertOutcome, StoreError> {
        let mut written = run.clone();
        let events = written.take_events();
        let idempotency = idempotency.cloned();
        let store = self.clone();
        let outcome = self
            .write(move |transaction, committed| {
                let run = written;
                let owner = run.owner.as_str();
                if let Some(claim) = &idempotency {
                    let existing = transaction
                        .prepare_cached(
                            "SELECT request_hash, run_id FROM idempotency
                         WHERE owner = ?1 AND key_hash = ?2 AND expires_at > ?3",
                        )
                        .and_then(|mut statement| {
                            statement
                                .query_row(params![owner, claim.key_hash, claim.created_at.millis()], |row| {
                                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                                })
                                .optional()
                        })
                        .map_err(unavailable)?;
                    if let Some((request_hash, run_id)) = existing {
                        let run_id = run_id
                            .parse()
                            .map_err(|_| StoreError::Defect("malformed run id in idempotency record".into()))?;
                        return Ok(InsertOutcome::IdempotencyKeyTaken(IdempotencyRecord { request_hash, run_id }));
                    }
                }
                let active: i64 = transaction
                    .prepare_cached("SELECT count FROM active_runs WHERE owner = ?1")
                    .and_then(|mut statement| statement.query_row(params![owner], |row| row.get(0)).optional())
                    .map_err(unavailable)?
                    .unwrap_or(0);
                if active >= i64::from(max_active) {
                    return Ok(InsertOutcome::TooManyActiveRuns);
                }
                let encoded_len = insert_run_row(transaction, &run)?;
                let queued = insert_events(transaction, &run.owner, &events)?;
                if let Some(claim) = &idempotency {
                    transaction
                        .prepare_cached(
                            "DELETE FROM idempotency WHERE (owner, key_hash) IN
                         (SELECT owner, key_hash FROM idempotency WHERE expires_at <= ?1 LIMIT ?2)",
                        )
                        .and_then(|mut statement| {
                            statement.execute(params![claim.created_at.millis() - PURGE_AFTER, PURGE_PER_CREATE])
                        })
                        .map_err(unavailable)?;
                    transaction
                        .prepare_cached(
                            "INSERT OR REPLACE INTO idempotency
                         (owner, key_hash, request_hash, run_id, created_at, expires_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        )
                        .and_then(|mut statement| {
                            statement.execute(params![
                                owner,
                                claim.key_hash,
                                claim.request_hash,
                                run.id.to_string(),
                                claim.created_at.millis(),
                                claim.expires_at.millis()
                            ])
                        })
                        .map_err(unavailable)?;
                }
                committed.then(move || store.runs_committed([(run, encoded_len, true)], queued));
                Ok(InsertOutcome::Inserted)
            })
            .await?;
        if matches!(outcome, InsertOutcome::Inserted) {
            // Counted and cleared as in the copy that was written.
            run.take_events();
        }
        Ok(outcome)
    }

    async fn undo_create(&self, run: &Run, idempotency_key_hash: Option<&str>) -> Result<bool, StoreError> {
        let (owner, run_id) = (run.owner.clone(), run.id);
        let key_hash = idempotency_key_hash.map(str::to_owned);
        let store = self.clone();
        self.write(move |transaction, committed| {
            let id = run_id.to_string();
            let removed = transaction
                .execute(
                    "DELETE FROM runs WHERE owner = ?1 AND id = ?2 AND version = 0 AND status = 'queued'",
                    params![owner.as_str(), id],
                )
                .map_err(unavailable)?;
            if removed == 0 {
                return Ok(false);
            }
            transaction.execute("DELETE FROM run_events WHERE run_id = ?1", params![id]).map_err(unavailable)?;
            transaction.execute("DELETE FROM webhook_outbox WHERE run_id = ?1", params![id]).map_err(unavailable)?;
            if let Some(key_hash) = key_hash {
                transaction
                    .execute(
                        "DELETE FROM idempotency WHERE owner = ?1 AND key_hash = ?2 AND run_id = ?3",
                        params![owner.as_str(), key_hash, id],
                    )
                    .map_err(unavailable)?;
            }
            committed.then(move || store.forget(&owner, run_id));
            Ok(true)
        })
        .await
    }

    async fn get(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        if let Some(cached) = self.inner.recent.as_ref().and_then(|recent| recent.get(owner, run_id)) {
            return Ok(Some(cached.run.clone()));
        }
        let owner = owner.to_string();
        self.read(move |connection| {
            let body: Option<String> = connection
                .prepare_cached("SELECT body FROM runs WHERE owner = ?1 AND id = ?2")
                .and_then(|mut statement| {
                    statement.query_row(params![owner, run_id.to_string()], |row| row.get(0)).optional()
                })
                .map_err(unavailable)?;
            body.as_deref().map(decode_run).transpose()
        })
        .await
    }

    async fn get_to_continue(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            let row: Option<(String, Option<String>)> = connection
                .prepare_cached("SELECT body, ended_checkpoint FROM runs WHERE owner = ?1 AND id = ?2")
                .and_then(|mut statement| {
                    statement
                        .query_row(params![owner, run_id.to_string()], |row| Ok((row.get(0)?, row.get(1)?)))
                        .optional()
                })
                .map_err(unavailable)?;
            let Some((body, ended_checkpoint)) = row else { return Ok(None) };
            let mut run = decode_run(&body)?;
            if let Some(checkpoint) = ended_checkpoint {
                run.checkpoint = serde_json::from_str(&checkpoint)
                    .map_err(|_| StoreError::Defect("malformed stored checkpoint".into()))?;
            }
            Ok(Some(run))
        })
        .await
    }

    async fn update(&self, run: &mut Run) -> Result<(), StoreError> {
        let result = self.update_batch(std::slice::from_mut(run)).await;
        result.map_err(|failed| failed.error)
    }

    async fn update_batch(&self, runs: &mut [Run]) -> Result<(), BatchWriteError> {
        let failed = |error| BatchWriteError { written: 0, error };
        let mut writes = Vec::with_capacity(runs.len());
        for run in runs.iter() {
            let mut next = run.clone();
            next.version += 1;
            let events = next.take_events();
            let row = RunRow::of(&next).map_err(failed)?;
            writes.push(PendingUpdate { expected: run.version, next, events, row });
        }
        let store = self.clone();
        let written = self
            .write(move |transaction, committed| {
                let mut queued = false;
                for write in &writes {
                    queued |= write.apply(transaction)?;
                }
                let nexts: Vec<Run> = writes.iter().map(|write| write.next.clone()).collect();
                committed.then(move || {
                    let written = writes.into_iter().map(|write| {
                        let with_events = !write.events.is_empty();
                        // Remembered as a get reads it: an ended run without
                        // the checkpoint it ended with.
                        let mut next = write.next;
                        if write.row.ended_checkpoint.is_some() {
                            next.checkpoint = None;
                        }
                        (next, write.row.body.len(), with_events)
                    });
                    store.runs_committed(written, queued)
                });
                Ok(nexts)
            })
            .await
            .map_err(failed)?;
        for (run, next) in runs.iter_mut().zip(written) {
            *run = next;
        }
        Ok(())
    }
}

impl SqliteStore {
    /// How many of the owner's runs are counted as active (for tests and
    /// inspection: the service reads the count only in the create's write).
    pub async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            connection
                .prepare_cached("SELECT count FROM active_runs WHERE owner = ?1")
                .and_then(|mut statement| statement.query_row(params![owner], |row| row.get(0)).optional())
                .map(Option::unwrap_or_default)
                .map_err(unavailable)
        })
        .await
    }
}
