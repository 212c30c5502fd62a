//! API keys and agent definitions.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use agent_runs_domain::{AgentDefinition, KeyId, Owner, Scopes, Timestamp};
use agent_runs_ports::store::{AgentStore, KeyStore, StoreError, StoredKey, decode_agent, encode_agent};

use crate::{SqliteStore, unavailable};

/// A key's row as read.
struct KeyRow {
    id: String,
    hash: Vec<u8>,
    owner: String,
    name: Option<String>,
    created_at: i64,
    revoked_at: Option<i64>,
    scopes: Option<String>,
}

fn key_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRow> {
    Ok(KeyRow {
        id: row.get(0)?,
        hash: row.get(1)?,
        owner: row.get(2)?,
        name: row.get(3)?,
        created_at: row.get(4)?,
        revoked_at: row.get(5)?,
        scopes: row.get(6)?,
    })
}

fn decode_key(row: KeyRow) -> Result<StoredKey, StoreError> {
    let KeyRow { id, hash, owner, name, created_at, revoked_at, scopes } = row;
    let defect = |what: &str| StoreError::Defect(format!("malformed stored key: {what}"));
    Ok(StoredKey {
        id: id.parse().map_err(|_| defect("id"))?,
        owner: Owner::parse(&owner).map_err(|_| defect("owner"))?,
        name,
        hash: hash.try_into().map_err(|_| defect("hash"))?,
        created_at: Timestamp::from_millis(created_at),
        revoked_at: revoked_at.map(Timestamp::from_millis),
        scopes: Scopes::stored(scopes.as_deref().map(str::split_whitespace)),
    })
}

const KEY_COLUMNS: &str = "id, hash, owner, name, created_at, revoked_at, scopes";

#[async_trait]
impl KeyStore for SqliteStore {
    async fn put_key(&self, key: &StoredKey) -> Result<(), StoreError> {
        let key = key.clone();
        self.write(move |connection, _| {
            connection
                .execute(
                    &format!("INSERT INTO api_keys ({KEY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                    params![
                        key.id.to_string(),
                        key.hash.to_vec(),
                        key.owner.as_str(),
                        key.name,
                        key.created_at.millis(),
                        key.revoked_at.map(Timestamp::millis),
                        key.scopes.to_stored().map(|names| names.join(" "))
                    ],
                )
                .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn find_key(&self, hash: &[u8; 32]) -> Result<Option<StoredKey>, StoreError> {
        let hash = hash.to_vec();
        self.read(move |connection| {
            connection
                .prepare_cached(&format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE hash = ?1"))
                .and_then(|mut statement| statement.query_row(params![hash], key_from_row).optional())
                .map_err(unavailable)?
                .map(decode_key)
                .transpose()
        })
        .await
    }

    async fn list_keys(&self) -> Result<Vec<StoredKey>, StoreError> {
        self.read(|connection| {
            let mut statement =
                connection.prepare(&format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY id")).map_err(unavailable)?;
            let rows = statement
                .query_map([], key_from_row)
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)?;
            rows.into_iter().map(decode_key).collect()
        })
        .await
    }

    async fn owner_keys(&self, owner: &Owner) -> Result<Vec<StoredKey>, StoreError> {
        let owner = owner.clone();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(&format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE owner = ?1 ORDER BY id LIMIT {}",
                    agent_runs_ports::store::MAX_OWNER_KEYS
                ))
                .map_err(unavailable)?;
            let rows = statement
                .query_map(params![owner.as_str()], key_from_row)
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(unavailable)?;
            rows.into_iter().map(decode_key).collect()
        })
        .await
    }

    async fn revoke_key(&self, id: KeyId, at: Timestamp) -> Result<bool, StoreError> {
        self.write(move |connection, _| {
            let found: Option<Option<i64>> = connection
                .query_row("SELECT revoked_at FROM api_keys WHERE id = ?1", params![id.to_string()], |row| row.get(0))
                .optional()
                .map_err(unavailable)?;
            match found {
                None => Ok(false),
                Some(Some(_)) => Ok(true),
                Some(None) => {
                    connection
                        .execute(
                            "UPDATE api_keys SET revoked_at = ?1 WHERE id = ?2",
                            params![at.millis(), id.to_string()],
                        )
                        .map_err(unavailable)?;
                    Ok(true)
                }
            }
        })
        .await
    }
}

#[async_trait]
impl AgentStore for SqliteStore {
    async fn put_agent(&self, agent: &AgentDefinition, at: Timestamp) -> Result<(), StoreError> {
        let name = agent.name.clone();
        let definition = encode_agent(agent)?;
        self.write(move |connection, _| {
            connection
                .execute(
                    "INSERT INTO agents (name, definition, updated_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, updated_at = excluded.updated_at",
                    params![name, definition, at.millis()],
                )
                .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn get_agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError> {
        let name = name.to_owned();
        self.read(move |connection| {
            connection
                .prepare_cached("SELECT definition FROM agents WHERE name = ?1")
                .and_then(|mut statement| statement.query_row(params![name], |row| row.get::<_, String>(0)).optional())
                .map_err(unavailable)?
                .map(|text| decode_agent(&text))
                .transpose()
        })
        .await
    }

    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError> {
        self.read(|connection| {
            let mut statement =
                connection.prepare("SELECT definition FROM agents ORDER BY name").map_err(unavailable)?;
            let rows = statement
                .query_map([], |row| row.get(0))
                .and_then(|rows| rows.collect::<Result<Vec<String>, _>>())
                .map_err(unavailable)?;
            rows.iter().map(|text| decode_agent(text)).collect()
        })
        .await
    }

    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.write(move |connection, _| {
            let deleted =
                connection.execute("DELETE FROM agents WHERE name = ?1", params![name]).map_err(unavailable)?;
            Ok(deleted > 0)
        })
        .await
    }
}
