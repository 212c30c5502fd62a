//! Identifiers: a prefix and an upper-case ULID (`run_01JDQ3...`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::Ulid;

use crate::time::Timestamp;

/// Parses `<prefix><26 upper-case Crockford base32 characters>` into its ULID.
fn parse_prefixed(prefix: &str, text: &str) -> Option<Ulid> {
    let body = text.strip_prefix(prefix)?;
    // 26 characters hold 130 bits; a ULID is 128, so the first is at most '7'.
    let well_formed = body.len() == 26
        && body.as_bytes()[0] <= b'7'
        && body
            .bytes()
            .all(|b| b.is_ascii_digit() || (b.is_ascii_uppercase() && !matches!(b, b'I' | b'L' | b'O' | b'U')));
    if !well_formed {
        return None;
    }
    Ulid::from_string(body).ok()
}

macro_rules! prefixed_id {
    ($name:ident, $prefix:literal, $what:literal) => {
        #[doc = concat!("The id of ", $what, ": `", $prefix, "` and a ULID.")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Ulid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            pub fn from_ulid(ulid: Ulid) -> Self {
                Self(ulid)
            }

            pub fn ulid(&self) -> Ulid {
                self.0
            }

            /// The moment encoded in the id.
            pub fn timestamp(&self) -> Timestamp {
                Timestamp::from_millis(self.0.timestamp_ms() as i64)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0)
            }
        }

        impl FromStr for $name {
            type Err = MalformedId;
            fn from_str(text: &str) -> Result<Self, MalformedId> {
                parse_prefixed($prefix, text).map(Self).ok_or(MalformedId)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(|_| serde::de::Error::custom(concat!("malformed ", $what, " id")))
            }
        }
    };
}

prefixed_id!(RunId, "run_", "a run");
prefixed_id!(ApprovalId, "apr_", "an approval");
prefixed_id!(KeyId, "key_", "an API key");
prefixed_id!(EventId, "evt_", "a run event");
prefixed_id!(WebhookId, "wh_", "a webhook endpoint");
prefixed_id!(DeliveryId, "dlv_", "a webhook delivery");

impl EventId {
    /// The id of a run's event, derived from what names it (the run and its
    /// `seq`) and when it happened: nothing needs storing, and every read
    /// shows the same id. The time leads, as in every ULID; the rest is a
    /// digest, so ids of one run do not reveal each other.
    pub fn of_event(run_id: RunId, seq: u64, at: Timestamp) -> Self {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new().chain_update(run_id.ulid().to_bytes()).chain_update(seq.to_be_bytes()).finalize();
        let mut random = [0u8; 16];
        random[6..].copy_from_slice(&digest[..10]);
        let random = u128::from_be_bytes(random);
        Self(Ulid::from_parts(at.millis().max(0) as u64, random))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed id")]
pub struct MalformedId;

/// The tenant that owns runs. Comes from the API key, never from the request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Owner(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an owner is 1 to 128 characters of letters, digits, '-', '_', '.', '@' or ':'")]
pub struct InvalidOwner;

impl Owner {
    pub fn parse(text: &str) -> Result<Self, InvalidOwner> {
        let valid = !text.is_empty()
            && text.len() <= 128
            && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b':'));
        if valid { Ok(Self(text.to_owned())) } else { Err(InvalidOwner) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Owner {
    type Error = InvalidOwner;
    fn try_from(text: String) -> Result<Self, InvalidOwner> {
        Self::parse(&text)
    }
}

impl From<Owner> for String {
    fn from(owner: Owner) -> String {
        owner.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Makes ids whose ULIDs are monotonic within this process, so ids made in
/// the same millisecond still sort in the order they were made.
pub struct IdGenerator {
    generator: std::sync::Mutex<ulid::Generator>,
}

impl Default for IdGenerator {
    fn default() -> Self {
        Self { generator: std::sync::Mutex::new(ulid::Generator::new()) }
    }
}

impl IdGenerator {
    pub fn ulid_at(&self, now: Timestamp) -> Ulid {
        let at = now.to_system_time();
        let mut generator = self.generator.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        generator.generate_from_datetime(at).unwrap_or_else(|_| Ulid::from_datetime(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_round_trip_and_reject_malformed_text() {
        let id = RunId::from_ulid(Ulid::from_parts(1_700_000_000_000, 42));
        let text = id.to_string();
        assert!(text.starts_with("run_") && text.len() == 30);
        assert_eq!(text.parse::<RunId>().unwrap(), id);
        assert_eq!(id.timestamp().millis(), 1_700_000_000_000);
        for bad in [
            "",
            "run_",
            "apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9",
            "run_01jdq3v7q4k8z2x9m5n6p7r8s9",
            "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S",
            "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9X",
            "run_01JDQ3V7Q4K8Z2X9M5N6P7R8SI",
            "run_81JDQ3V7Q4K8Z2X9M5N6P7R8S9",
        ] {
            assert!(bad.parse::<RunId>().is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn owners_are_restricted_to_a_safe_alphabet() {
        assert!(Owner::parse("acme-corp_1").is_ok());
        assert!(Owner::parse("").is_err());
        assert!(Owner::parse("a b").is_err());
        assert!(Owner::parse("a#b").is_err());
        assert!(Owner::parse(&"a".repeat(129)).is_err());
    }
}
