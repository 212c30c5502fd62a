//! Requests that hold their connection: event streams and `wait`
//! long-polls. Each owner may hold a few at once, all owners together at
//! most a share of the server's connections (the rest stay free for
//! ordinary requests), and a held request keeps checking that its key
//! still stands.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::ApiError;
use crate::auth::{Authenticator, hash_key};
use agent_runs_domain::Owner;
use agent_runs_ports::store::StoreError;

/// The longest `wait` a long-poll may ask for, and the longest it is held
/// unless a deployment allows less ([`HoldLimits::max_wait`]).
pub const MAX_WAIT_SECS: u64 = 20;

/// How much the held requests may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HoldLimits {
    /// Streams and long-polls one owner may hold at once.
    pub per_owner: u32,
    /// Streams and long-polls all owners may hold at once.
    pub total: u32,
    /// A stream is ended after this long; the client resumes with its
    /// `Last-Event-ID`.
    pub stream_lifetime: Duration,
    /// The longest a long-poll is held, whatever its `wait` asks.
    pub max_wait: Duration,
}

impl Default for HoldLimits {
    fn default() -> Self {
        HoldLimits {
            per_owner: 32,
            total: 256,
            stream_lifetime: Duration::from_secs(15 * 60),
            max_wait: Duration::from_secs(MAX_WAIT_SECS),
        }
    }
}

/// Seconds a client refused a hold is told to wait.
const RETRY_AFTER_SECS: u64 = 5;

/// The held requests of this process, by owner.
pub(super) struct Holds {
    limits: HoldLimits,
    held: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: u32,
    by_owner: HashMap<Owner, u32>,
}

/// One held request; giving it back when dropped.
pub struct Hold {
    holds: Arc<Holds>,
    owner: Owner,
}

impl Holds {
    pub fn new(limits: HoldLimits) -> Arc<Self> {
        Arc::new(Holds { limits, held: Mutex::default() })
    }

    pub fn limits(&self) -> &HoldLimits {
        &self.limits
    }

    /// A hold for `owner`, or `429` when the owner, or everyone together,
    /// holds as many as allowed.
    pub fn take(self: &Arc<Self>, owner: &Owner) -> Result<Hold, ApiError> {
        let mut counts = agent_runs_ports::lock(&self.held);
        let of_owner = counts.by_owner.get(owner).copied().unwrap_or(0);
        if of_owner >= self.limits.per_owner {
            return Err(ApiError::RateLimited {
                message: format!(
                    "This API key's owner already holds {} event streams and waiting polls, the most allowed at once. Close one, or poll without `wait`.",
                    self.limits.per_owner
                ),
                retry_after_secs: RETRY_AFTER_SECS,
            });
        }
        if counts.total >= self.limits.total {
            return Err(ApiError::RateLimited {
                message: "The server holds as many event streams and waiting polls as it allows. Retry after the time in Retry-After, or poll without `wait`.".into(),
                retry_after_secs: RETRY_AFTER_SECS,
            });
        }
        counts.total += 1;
        *counts.by_owner.entry(owner.clone()).or_default() += 1;
        Ok(Hold { holds: self.clone(), owner: owner.clone() })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut counts = agent_runs_ports::lock(&self.holds.held);
        counts.total = counts.total.saturating_sub(1);
        if let Some(count) = counts.by_owner.get_mut(&self.owner) {
            *count -= 1;
            if *count == 0 {
                counts.by_owner.remove(&self.owner);
            }
        }
    }
}

/// The key a held request was made with, looked up again (past any cache)
/// every `every`, so a revoked key's stream or long-poll ends within that.
#[derive(Clone)]
pub struct KeyCheck {
    auth: Authenticator,
    hash: [u8; 32],
    every: Duration,
    next: Instant,
}

impl KeyCheck {
    pub(super) fn new(auth: &Authenticator, secret: &str) -> Self {
        // As often as a cached key is trusted, and at least once a second.
        let every = auth.cache_ttl().max(Duration::from_secs(1));
        // The first lookup at once: the request may have been let in by a
        // cached key that was revoked since.
        KeyCheck { auth: auth.clone(), hash: hash_key(secret), every, next: Instant::now() }
    }

    /// When the key is next looked up.
    pub fn due_at(&self) -> Instant {
        self.next
    }

    /// Whether the key still stands: looked up when due, else `true`.
    pub async fn still_valid(&mut self) -> Result<bool, StoreError> {
        if Instant::now() < self.next {
            return Ok(true);
        }
        let valid = self.auth.still_valid(&self.hash).await;
        // Timed from the answer: a slow lookup is not followed by another at once.
        self.next = Instant::now() + self.every;
        valid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_owner_holds_at_most_its_share_and_all_together_at_most_the_total() {
        let holds = Holds::new(HoldLimits { per_owner: 2, total: 3, ..HoldLimits::default() });
        let (acme, other) = (Owner::parse("acme").unwrap(), Owner::parse("other").unwrap());
        let first = holds.take(&acme).unwrap();
        let _second = holds.take(&acme).unwrap();
        let Err(ApiError::RateLimited { message, retry_after_secs }) = holds.take(&acme) else {
            panic!("a third hold of one owner must be refused");
        };
        assert!(message.contains("2 event streams"), "{message}");
        assert!(retry_after_secs >= 1);
        let _third = holds.take(&other).unwrap();
        assert!(holds.take(&other).is_err(), "the total is taken");
        drop(first);
        let _again = holds.take(&other).expect("a dropped hold is given back");
        assert!(holds.take(&acme).is_err());
    }
}
