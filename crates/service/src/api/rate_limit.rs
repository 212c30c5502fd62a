//! Per-owner request rate: a token bucket per owner, in this process.

use std::collections::HashMap;
use std::sync::Mutex;

use super::ApiError;
use agent_runs_domain::{Owner, Timestamp};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second; 0 turns the limit off.
    pub per_second: f64,
    /// Requests that may come at once after a quiet spell.
    pub burst: f64,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self { per_second: 500.0, burst: 1_000.0 }
    }
}

struct Bucket {
    tokens: f64,
    refilled_at: Timestamp,
}

pub(super) struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<Owner, Bucket>>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> Self {
        Self { limit, buckets: Mutex::default() }
    }

    pub fn check(&self, owner: &Owner, now: Timestamp) -> Result<(), ApiError> {
        if self.limit.per_second <= 0.0 {
            return Ok(());
        }
        let mut buckets = agent_runs_ports::lock(&self.buckets);
        if !buckets.contains_key(owner) {
            buckets.insert(owner.clone(), Bucket { tokens: self.limit.burst, refilled_at: now });
        }
        let bucket = buckets.get_mut(owner).expect("inserted above");
        let elapsed = now.since(bucket.refilled_at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.limit.per_second).min(self.limit.burst);
        bucket.refilled_at = now.max(bucket.refilled_at);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / self.limit.per_second;
        Err(ApiError::RateLimited {
            message: "Too many requests for this API key's owner. Slow down and retry after the time in Retry-After."
                .into(),
            retry_after_secs: wait.ceil().max(1.0) as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_burst_then_refills_at_the_rate() {
        let limiter = RateLimiter::new(RateLimit { per_second: 2.0, burst: 3.0 });
        let owner = Owner::parse("acme").unwrap();
        let other = Owner::parse("other").unwrap();
        let t0 = Timestamp::from_millis(1_000_000);
        for _ in 0..3 {
            assert!(limiter.check(&owner, t0).is_ok());
        }
        let Err(ApiError::RateLimited { retry_after_secs, .. }) = limiter.check(&owner, t0) else {
            panic!("the fourth request at once must be limited");
        };
        assert_eq!(retry_after_secs, 1);
        assert!(limiter.check(&other, t0).is_ok(), "owners have separate buckets");
        assert!(limiter.check(&owner, Timestamp::from_millis(1_000_500)).is_ok());
        assert!(limiter.check(&owner, Timestamp::from_millis(1_000_500)).is_err());
    }
}
