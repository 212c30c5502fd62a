//! Approval policies, and the history of the tool calls people decided.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use agent_runs_domain::{
    DecidedCall, Event, EventData, HumanDecision, KeyId, Owner, Policy, Rule, Timestamp, canonical_json,
};
use agent_runs_ports::store::{PolicyStore, Run, StoreError, decode_policy, encode_policy};

use crate::{SqliteStore, unavailable};

/// Adds the calls a person decided in `events` to the history, in the
/// write that records the decision.
pub(super) fn record_decisions(connection: &Connection, run: &Run, events: &[Event]) -> Result<(), StoreError> {
    let decided = events.iter().filter_map(|event| match &event.data {
        EventData::ApprovalDecided(approval) => DecidedCall::of(run.id, &run.agent, approval),
        _ => None,
    });
    for call in decided {
        connection
            .prepare_cached(
                "INSERT OR REPLACE INTO decisions
                     (owner, run_id, approval_id, resolved_at, agent, tool, arguments, decision)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut statement| {
                statement.execute(params![
                    run.owner.as_str(),
                    call.run_id.to_string(),
                    call.approval_id.to_string(),
                    call.resolved_at.millis(),
                    call.agent,
                    call.tool,
                    canonical_json(&call.arguments),
                    call.human.as_str()
                ])
            })
            .map_err(unavailable)?;
    }
    Ok(())
}

struct DecisionRow {
    run_id: String,
    approval_id: String,
    resolved_at: i64,
    agent: String,
    tool: String,
    arguments: String,
    decision: String,
}

impl DecisionRow {
    fn decode(self) -> Result<DecidedCall, StoreError> {
        let malformed = || StoreError::Defect("a stored decision is malformed".into());
        Ok(DecidedCall {
            run_id: self.run_id.parse().map_err(|_| malformed())?,
            approval_id: self.approval_id.parse().map_err(|_| malformed())?,
            agent: self.agent,
            tool: self.tool,
            arguments: serde_json::from_str(&self.arguments).map_err(|_| malformed())?,
            human: HumanDecision::parse(&self.decision).ok_or_else(malformed)?,
            resolved_at: Timestamp::from_millis(self.resolved_at),
        })
    }
}

#[async_trait]
impl PolicyStore for SqliteStore {
    /// The default document when none was put.
    async fn read_policy(&self, owner: &Owner, known: Option<u64>) -> Result<Option<Policy>, StoreError> {
        let owner = owner.to_string();
        // A stored version is never negative: -1 matches none.
        let known_version = known.map_or(-1, |version| i64::try_from(version).unwrap_or(-1));
        let row: Option<(i64, Option<String>)> = self
            .read(move |connection| {
                connection
                    .prepare_cached(
                        "SELECT version, CASE WHEN version = ?2 THEN NULL ELSE document END FROM policies WHERE owner = ?1",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_row(rusqlite::params![owner, known_version], |row| Ok((row.get(0)?, row.get(1)?)))
                            .optional()
                    })
                    .map_err(unavailable)
            })
            .await?;
        match row {
            None if known == Some(0) => Ok(None),
            None => Ok(Some(Policy::default())),
            Some((_, None)) => Ok(None),
            Some((version, Some(document))) => decode_policy(version.max(0) as u64, &document).map(Some),
        }
    }

    async fn put_policy(
        &self,
        owner: &Owner,
        expected: Option<u64>,
        rules: &[Rule],
        at: Timestamp,
        by: KeyId,
    ) -> Result<Option<Policy>, StoreError> {
        let owner = owner.to_string();
        let document = encode_policy(rules, at, by);
        let stored = document.clone();
        // A version past any stored one matches nothing.
        let expected = expected.map(|version| i64::try_from(version).unwrap_or(-1));
        let version: Option<i64> = self
            .write(move |transaction, _| {
                let sql = match expected {
                    None => {
                        "INSERT INTO policies (owner, version, document) VALUES (?1, 1, ?2)
                         ON CONFLICT (owner) DO UPDATE SET version = version + 1, document = excluded.document
                         RETURNING version"
                    }
                    Some(0) => {
                        "INSERT INTO policies (owner, version, document) VALUES (?1, 1, ?2)
                         ON CONFLICT DO NOTHING RETURNING version"
                    }
                    Some(_) => {
                        "UPDATE policies SET version = version + 1, document = ?2 WHERE owner = ?1 AND version = ?3
                         RETURNING version"
                    }
                };
                let mut statement = transaction.prepare_cached(sql).map_err(unavailable)?;
                let version = match expected {
                    Some(version) if version != 0 => {
                        statement.query_row(params![owner, stored, version], |row| row.get(0))
                    }
                    _ => statement.query_row(params![owner, stored], |row| row.get(0)),
                };
                version.optional().map_err(unavailable)
            })
            .await?;
        version.map(|version| decode_policy(version.max(0) as u64, &document)).transpose()
    }

    async fn decided_calls(&self, owner: &Owner, limit: usize) -> Result<Vec<DecidedCall>, StoreError> {
        let owner = owner.to_string();
        let rows: Vec<DecisionRow> = self
            .read(move |connection| {
                connection
                    .prepare_cached(
                        "SELECT run_id, approval_id, resolved_at, agent, tool, arguments, decision FROM decisions
                         WHERE owner = ?1 ORDER BY resolved_at DESC, run_id DESC, approval_id DESC LIMIT ?2",
                    )
                    .and_then(|mut statement| {
                        statement
                            .query_map(params![owner, limit.min(i64::MAX as usize) as i64], |row| {
                                Ok(DecisionRow {
                                    run_id: row.get(0)?,
                                    approval_id: row.get(1)?,
                                    resolved_at: row.get(2)?,
                                    agent: row.get(3)?,
                                    tool: row.get(4)?,
                                    arguments: row.get(5)?,
                                    decision: row.get(6)?,
                                })
                            })?
                            .collect()
                    })
                    .map_err(unavailable)
            })
            .await?;
        rows.into_iter().map(DecisionRow::decode).collect()
    }
}
