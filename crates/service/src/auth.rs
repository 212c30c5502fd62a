//! API keys: `ark_` and 43 random base62 characters (about 256 bits). Only the
//! SHA-256 of a key is stored; a presented key is hashed and looked up by its
//! hash, and the stored hash is compared in constant time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use agent_runs_domain::{KeyId, Owner, Scopes, Timestamp};
use agent_runs_ports::store::{KeyStore, StoreError, StoredKey};

pub const KEY_PREFIX: &str = "ark_";
const KEY_RANDOM_CHARS: usize = 43;
const MIN_KEY_RANDOM_CHARS: usize = 40;
const MAX_KEY_LEN: usize = 256;
const CACHE_CAPACITY: usize = 10_000;

/// A key as issued: shown once, never stored.
pub struct IssuedKey {
    pub secret: String,
    pub stored: StoredKey,
}

pub fn hash_key(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether the text has the shape of one of our keys; anything else is
/// refused without a lookup.
fn well_formed(secret: &str) -> bool {
    secret.len() <= MAX_KEY_LEN
        && secret
            .strip_prefix(KEY_PREFIX)
            .is_some_and(|rest| rest.len() >= MIN_KEY_RANDOM_CHARS && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

pub fn generate_key(id: KeyId, owner: Owner, name: Option<String>, now: Timestamp) -> IssuedKey {
    let random: String = rand::rng().sample_iter(Alphanumeric).take(KEY_RANDOM_CHARS).map(char::from).collect();
    let secret = format!("{KEY_PREFIX}{random}");
    let stored = StoredKey {
        id,
        owner,
        name,
        hash: hash_key(&secret),
        created_at: now,
        revoked_at: None,
        scopes: Scopes::all(),
    };
    IssuedKey { secret, stored }
}

/// Extracts the key from an `Authorization` header value: `Bearer <key>`,
/// the scheme name in any case.
pub fn bearer_token(header: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(header).ok()?;
    let (scheme, token) = text.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim_start()).filter(|token| !token.is_empty())
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no usable API key")]
    Unauthorized,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Who a verified key speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub owner: Owner,
    pub key_id: KeyId,
    pub scopes: Scopes,
    /// The key's label (`keys create --name`).
    pub key_name: Option<String>,
    pub key_created_at: Timestamp,
}

/// Verifies keys through the key store, remembering verified ones for
/// `cache_ttl` so a warm process makes no lookup per request.
#[derive(Clone)]
pub struct Authenticator {
    keys: Arc<dyn KeyStore>,
    cache_ttl: Duration,
    cache: Arc<Mutex<HashMap<KeyHash, (Principal, Instant)>>>,
}

/// The SHA-256 of an API key, which the cache is keyed by.
type KeyHash = [u8; 32];

impl Authenticator {
    /// A zero `cache_ttl` asks the store every time, so a revocation is
    /// seen at once.
    pub fn new(keys: Arc<dyn KeyStore>, cache_ttl: Duration) -> Self {
        Self { keys, cache_ttl, cache: Arc::default() }
    }

    /// The store keys are verified against.
    pub fn keys(&self) -> &dyn KeyStore {
        self.keys.as_ref()
    }

    pub async fn authenticate(&self, secret: &str) -> Result<Principal, AuthError> {
        if !well_formed(secret) {
            return Err(AuthError::Unauthorized);
        }
        let hash = hash_key(secret);
        if let Some(principal) = self.cached(&hash) {
            return Ok(principal);
        }
        let stored = self.keys.find_key(&hash).await?.ok_or(AuthError::Unauthorized)?;
        let matches: bool = stored.hash.ct_eq(&hash).into();
        if !matches || stored.revoked_at.is_some() {
            return Err(AuthError::Unauthorized);
        }
        let principal = Principal {
            owner: stored.owner,
            key_id: stored.id,
            scopes: stored.scopes,
            key_name: stored.name,
            key_created_at: stored.created_at,
        };
        if !self.cache_ttl.is_zero() {
            self.remember(hash, principal.clone());
        }
        Ok(principal)
    }

    /// How long a verified key is trusted without a lookup.
    pub fn cache_ttl(&self) -> Duration {
        self.cache_ttl
    }

    /// Whether the key with this hash still stands, asked of the store past
    /// the cache; a key found revoked is forgotten by the cache too.
    pub async fn still_valid(&self, hash: &KeyHash) -> Result<bool, StoreError> {
        let valid = self.keys.find_key(hash).await?.is_some_and(|stored| {
            let matches: bool = stored.hash.ct_eq(hash).into();
            matches && stored.revoked_at.is_none()
        });
        if !valid {
            agent_runs_ports::lock(&self.cache).remove(hash);
        }
        Ok(valid)
    }

    fn cached(&self, hash: &[u8; 32]) -> Option<Principal> {
        let cache = agent_runs_ports::lock(&self.cache);
        cache.get(hash).filter(|(_, at)| at.elapsed() < self.cache_ttl).map(|(principal, _)| principal.clone())
    }

    fn remember(&self, hash: [u8; 32], principal: Principal) {
        let mut cache = agent_runs_ports::lock(&self.cache);
        if cache.len() >= CACHE_CAPACITY {
            cache.retain(|_, (_, at)| at.elapsed() < self.cache_ttl);
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
        }
        cache.insert(hash, (principal, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_documented_shape() {
        let id = KeyId::from_ulid(ulid::Ulid::new());
        let a = generate_key(id, Owner::parse("dev").unwrap(), None, Timestamp::from_millis(0));
        let b = generate_key(id, Owner::parse("dev").unwrap(), None, Timestamp::from_millis(0));
        assert!(a.secret.starts_with("ark_"));
        assert_eq!(a.secret.len(), 4 + 43);
        assert!(well_formed(&a.secret));
        assert_ne!(a.secret, b.secret);
        assert_eq!(a.stored.hash, hash_key(&a.secret));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token(b"Bearer ark_x"), Some("ark_x"));
        assert_eq!(bearer_token(b"bEaReR ark_x"), Some("ark_x"));
        assert_eq!(bearer_token(b"Basic ark_x"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"ark_x"), None);
    }

    #[test]
    fn malformed_keys_are_refused_before_any_lookup() {
        assert!(!well_formed("ark_short"));
        assert!(!well_formed(&format!("xrk_{}", "a".repeat(43))));
        assert!(!well_formed(&format!("ark_{}-", "a".repeat(43))));
        assert!(well_formed(&format!("ark_{}", "a".repeat(40))));
    }
}
