use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat};
use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const MAX: Timestamp = Timestamp(i64::MAX);

    pub fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    pub fn millis(self) -> i64 {
        self.0
    }

    pub fn plus(self, duration: Duration) -> Self {
        Self(self.0.saturating_add(duration.as_millis().min(i64::MAX as u128) as i64))
    }

    /// The same moment as a `SystemTime` (moments before 1970 as 1970).
    pub fn to_system_time(self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_millis(self.0.max(0) as u64)
    }

    /// The time from `earlier` to `self`, zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }

    /// RFC 3339 in UTC with millisecond precision and a `Z`: `2026-11-21T23:24:38.123Z`.
    /// Always 24 characters, so the text sorts as the time does: moments
    /// outside years 0000 to 9999 are clamped to them.
    pub fn to_rfc3339(self) -> String {
        const LAST_OF_9999: i64 = 253_402_300_799_999;
        const FIRST_OF_0000: i64 = -62_167_219_200_000;
        DateTime::from_timestamp_millis(self.0.clamp(FIRST_OF_0000, LAST_OF_9999))
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::Millis, true)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

/// The source of "now". Injected so tests can control time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp(chrono::Utc::now().timestamp_millis())
    }
}

/// A clock that moves only when told to: tests control time with it.
#[derive(Debug)]
pub struct ManualClock(std::sync::atomic::AtomicI64);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        Self(std::sync::atomic::AtomicI64::new(start.0))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis().min(i64::MAX as u128) as i64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_utc_with_milliseconds() {
        assert_eq!(Timestamp::from_millis(0).to_rfc3339(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_millis(1_795_303_478_123).to_rfc3339(), "2026-11-21T23:24:38.123Z");
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_millis(1_000);
        assert_eq!(t.plus(Duration::from_secs(1)).millis(), 2_000);
        assert_eq!(t.since(Timestamp::from_millis(2_000)), Duration::ZERO);
        assert_eq!(Timestamp::MAX.plus(Duration::from_secs(1)), Timestamp::MAX);
        assert_eq!(Timestamp::MAX.to_rfc3339(), "9999-12-31T23:59:59.999Z");
    }
}
