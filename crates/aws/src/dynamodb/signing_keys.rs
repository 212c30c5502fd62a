//! The public keys approval receipts are signed with, for the JWKS: one
//! item, `SIGNING_KEYS` / `JWKS`, an attribute `key#<kid>` per key holding
//! its point and when it was last published. The sweeper publishes the
//! key at its first pass, a worker before it first signs, and each again
//! hourly (the only functions that may read the KMS key); the API's
//! `$default` route reads the item. Keys not published for 7 days leave
//! the JWKS: a receipt lives 5 minutes.

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::{DynamoStore, s};
use agent_runs_domain::{Clock, SystemClock};
use agent_runs_ports::receipts::KeyPublisher;
use agent_runs_ports::receipts::{PublicKey, PublishedKeys, SignError};

const KEYS_PK: &str = "SIGNING_KEYS";
const KEYS_SK: &str = "JWKS";
const KEY_PREFIX: &str = "key#";
const SHOWN_FOR_MS: i64 = 7 * 24 * 3600 * 1000;

fn failed(error: impl std::fmt::Display) -> SignError {
    tracing::error!(%error, "the signing keys could not be read or written");
    SignError("the signing keys are unavailable".into())
}

#[async_trait]
impl KeyPublisher for DynamoStore {
    async fn publish(&self, key: &PublicKey) -> Result<(), SignError> {
        let jwk = key.jwk();
        let entry = serde_json::json!({"x": jwk["x"], "y": jwk["y"], "published_at": SystemClock.now().millis()});
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(KEYS_PK))
            .key("sk", s(KEYS_SK))
            .update_expression("SET #key = :entry")
            .expression_attribute_names("#key", format!("{KEY_PREFIX}{}", key.kid))
            .expression_attribute_values(":entry", s(entry.to_string()))
            .send()
            .await
            .map_err(failed)?;
        Ok(())
    }
}

#[async_trait]
impl PublishedKeys for DynamoStore {
    async fn keys(&self) -> Result<Vec<PublicKey>, SignError> {
        let item = self.get_item(KEYS_PK.into(), KEYS_SK.into()).await.map_err(failed)?.unwrap_or_default();
        let since = SystemClock.now().millis() - SHOWN_FOR_MS;
        let mut keys: Vec<(i64, PublicKey)> = item
            .iter()
            .filter(|(name, _)| name.starts_with(KEY_PREFIX))
            .filter_map(|(_, value)| {
                let entry: serde_json::Value = serde_json::from_str(value.as_s().ok()?).ok()?;
                let coordinate = |name: &str| URL_SAFE_NO_PAD.decode(entry[name].as_str()?).ok();
                let point = [vec![4], coordinate("x")?, coordinate("y")?].concat();
                let published = entry["published_at"].as_i64()?;
                Some((published, PublicKey::from_point(&point)?))
            })
            .filter(|(published, _)| *published >= since)
            .collect();
        // The newest first.
        keys.sort_by_key(|(published, _)| std::cmp::Reverse(*published));
        Ok(keys.into_iter().map(|(_, key)| key).collect())
    }
}
