//! API keys in the table: `KEY#<hex of the key's SHA-256>` / `KEY`, each
//! also in the status index under `KEYS#<owner>` / `<key id>` (an owner's
//! keys by name, for whoever shows who did what).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use aws_sdk_dynamodb::types::AttributeValue;

use super::items::{defect, text, unavailable};
use super::{DynamoStore, Item, STATUS_INDEX, n, s};
use agent_runs_domain::{KeyId, Owner, Scopes, Timestamp};
use agent_runs_ports::store::{KeyStore, MAX_OWNER_KEYS, StoreError, StoredKey};

#[derive(Serialize, Deserialize)]
struct KeyItem {
    key_id: KeyId,
    owner: Owner,
    name: Option<String>,
    created_at: Timestamp,
    revoked_at: Option<Timestamp>,
    /// Absent on keys from before scopes and keys made without `--scope`:
    /// every scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scopes: Option<Vec<String>>,
}

fn key_pk(hash: &[u8; 32]) -> String {
    format!("KEY#{}", hex::encode(hash))
}

fn owner_keys_pk(owner: &Owner) -> String {
    format!("KEYS#{owner}")
}

/// The status index's attributes that list a key among its owner's.
fn owner_keys_entry(owner: &Owner, id: KeyId) -> [(&'static str, AttributeValue); 2] {
    [("gsi1pk", s(owner_keys_pk(owner))), ("gsi1sk", s(id.to_string()))]
}

impl DynamoStore {
    /// Adds the keys made before owners' keys were listed to their owner's
    /// list (a migration); how many. An item that is not a key as this
    /// version reads keys is left as it is.
    pub(super) async fn list_unlisted_keys(&self) -> Result<usize, StoreError> {
        let unlisted = self.scan_filtered("sk = :key AND attribute_not_exists(gsi1pk)", [(":key", s("KEY"))]).await?;
        let mut listed = 0;
        for item in unlisted {
            let Ok(key) = decode_key(item) else { continue };
            let [(pk_name, pk), (sk_name, sk)] = owner_keys_entry(&key.owner, key.id);
            self.client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(key_pk(&key.hash)))
                .key("sk", s("KEY"))
                .condition_expression("attribute_exists(pk)")
                .update_expression(format!("SET {pk_name} = :pk, {sk_name} = :sk"))
                .expression_attribute_values(":pk", pk)
                .expression_attribute_values(":sk", sk)
                .send()
                .await
                .map_err(unavailable)?;
            listed += 1;
        }
        Ok(listed)
    }
}

fn decode_key(item: Item) -> Result<StoredKey, StoreError> {
    let hash_hex = text(&item, "pk")?.strip_prefix("KEY#").ok_or_else(|| defect("key item without KEY# pk"))?;
    let hash: [u8; 32] = hex::decode(hash_hex)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| defect("key item with a malformed hash"))?;
    let key: KeyItem = serde_dynamo::from_item(item).map_err(|error| defect(format!("cannot decode key: {error}")))?;
    Ok(StoredKey {
        id: key.key_id,
        owner: key.owner,
        name: key.name,
        hash,
        created_at: key.created_at,
        revoked_at: key.revoked_at,
        scopes: Scopes::stored(key.scopes.as_ref().map(|names| names.iter().map(String::as_str))),
    })
}

#[async_trait]
impl KeyStore for DynamoStore {
    async fn put_key(&self, key: &StoredKey) -> Result<(), StoreError> {
        let record = KeyItem {
            key_id: key.id,
            owner: key.owner.clone(),
            name: key.name.clone(),
            created_at: key.created_at,
            revoked_at: key.revoked_at,
            scopes: key.scopes.to_stored().map(|names| names.into_iter().map(str::to_owned).collect()),
        };
        let mut item: Item = serde_dynamo::to_item(record).map_err(defect)?;
        item.insert("pk".into(), s(key_pk(&key.hash)));
        item.insert("sk".into(), s("KEY"));
        item.extend(owner_keys_entry(&key.owner, key.id).map(|(name, value)| (name.to_owned(), value)));
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn find_key(&self, hash: &[u8; 32]) -> Result<Option<StoredKey>, StoreError> {
        self.get_item(key_pk(hash), "KEY".into()).await?.map(decode_key).transpose()
    }

    async fn list_keys(&self) -> Result<Vec<StoredKey>, StoreError> {
        let mut keys = Vec::new();
        for item in self.scan_kind("KEY").await? {
            keys.push(decode_key(item)?);
        }
        keys.sort_by_key(|key| key.id);
        Ok(keys)
    }

    async fn owner_keys(&self, owner: &Owner) -> Result<Vec<StoredKey>, StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(STATUS_INDEX)
            .key_condition_expression("gsi1pk = :pk")
            .expression_attribute_values(":pk", s(owner_keys_pk(owner)));
        self.query_up_to(query, None, MAX_OWNER_KEYS, decode_key).await
    }

    async fn revoke_key(&self, id: KeyId, at: Timestamp) -> Result<bool, StoreError> {
        let Some(key) = self.list_keys().await?.into_iter().find(|key| key.id == id) else {
            return Ok(false);
        };
        if key.revoked_at.is_some() {
            return Ok(true);
        }
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(key_pk(&key.hash)))
            .key("sk", s("KEY"))
            .update_expression("SET revoked_at = :at")
            .expression_attribute_values(":at", n(at.millis()))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(true)
    }
}
