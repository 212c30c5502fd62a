//! Values a client sends, parsed once at the boundary into types that hold
//! only valid values.

use std::collections::BTreeMap;

pub const MAX_INPUT_BYTES: usize = 65_536;
pub const MAX_METADATA_KEYS: usize = 16;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;
pub const MAX_COMMENT_CHARS: usize = 1_000;
pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

/// What was wrong with one field, in words a client can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FieldError(pub String);

/// A run's input: 1 to 65,536 bytes of UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInput(String);

impl RunInput {
    pub fn parse(text: String) -> Result<Self, FieldError> {
        if text.is_empty() {
            return Err(FieldError("`input` must not be empty.".into()));
        }
        if text.len() > MAX_INPUT_BYTES {
            return Err(FieldError(format!(
                "`input` is {} bytes long; the maximum is {MAX_INPUT_BYTES} bytes of UTF-8.",
                text.len()
            )));
        }
        Ok(Self(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// Client-supplied labels: at most 16 keys of 1 to 64 characters, each with a
/// string value of at most 512 characters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    pub fn parse(entries: Vec<(String, String)>) -> Result<Self, FieldError> {
        if entries.len() > MAX_METADATA_KEYS {
            return Err(FieldError(format!(
                "`metadata` has {} keys; the maximum is {MAX_METADATA_KEYS}.",
                entries.len()
            )));
        }
        let mut map = BTreeMap::new();
        for (key, value) in entries {
            let key_chars = key.chars().count();
            if key_chars == 0 || key_chars > MAX_METADATA_KEY_CHARS {
                return Err(FieldError(format!(
                    "`metadata` keys must be 1 to {MAX_METADATA_KEY_CHARS} characters long."
                )));
            }
            if value.chars().count() > MAX_METADATA_VALUE_CHARS {
                return Err(FieldError(format!(
                    "The value of `metadata.{key}` is longer than {MAX_METADATA_VALUE_CHARS} characters."
                )));
            }
            map.insert(key, value);
        }
        Ok(Self(map))
    }

    pub fn into_map(self) -> BTreeMap<String, String> {
        self.0
    }

    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

/// A decider's comment on an approval: at most 1,000 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment(String);

impl Comment {
    pub fn parse(text: String) -> Result<Self, FieldError> {
        if text.chars().count() > MAX_COMMENT_CHARS {
            return Err(FieldError(format!("`comment` is longer than {MAX_COMMENT_CHARS} characters.")));
        }
        Ok(Self(text))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// An `Idempotency-Key`: 1 to 255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(text: &[u8]) -> Result<Self, FieldError> {
        let printable = text.iter().all(|b| (0x20..=0x7e).contains(b));
        if text.is_empty() || text.len() > MAX_IDEMPOTENCY_KEY_CHARS || !printable {
            return Err(FieldError(format!(
                "The Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters."
            )));
        }
        Ok(Self(String::from_utf8_lossy(text).into_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_bounds_are_in_bytes() {
        assert!(RunInput::parse(String::new()).is_err());
        assert!(RunInput::parse("x".repeat(MAX_INPUT_BYTES)).is_ok());
        assert!(RunInput::parse("x".repeat(MAX_INPUT_BYTES + 1)).is_err());
        // 4-byte characters: 16,384 of them is exactly the limit.
        assert!(RunInput::parse("😀".repeat(MAX_INPUT_BYTES / 4)).is_ok());
        assert!(RunInput::parse(format!("{}x", "😀".repeat(MAX_INPUT_BYTES / 4))).is_err());
    }

    #[test]
    fn metadata_bounds_are_in_characters() {
        let entries = |n: usize| (0..n).map(|i| (format!("k{i}"), "v".to_owned())).collect::<Vec<_>>();
        assert!(Metadata::parse(entries(16)).is_ok());
        assert!(Metadata::parse(entries(17)).is_err());
        assert!(Metadata::parse(vec![(String::new(), "v".into())]).is_err());
        assert!(Metadata::parse(vec![("é".repeat(64), "é".repeat(512))]).is_ok());
        assert!(Metadata::parse(vec![("é".repeat(65), "v".into())]).is_err());
        assert!(Metadata::parse(vec![("k".into(), "é".repeat(513))]).is_err());
    }

    #[test]
    fn comments_and_idempotency_keys_have_bounds() {
        assert!(Comment::parse("é".repeat(1_000)).is_ok());
        assert!(Comment::parse("é".repeat(1_001)).is_err());
        assert!(IdempotencyKey::parse(b"order-42 retry").is_ok());
        assert!(IdempotencyKey::parse(&[b'a'; 255]).is_ok());
        assert!(IdempotencyKey::parse(&[b'a'; 256]).is_err());
        assert!(IdempotencyKey::parse(b"").is_err());
        assert!(IdempotencyKey::parse(b"tab\there").is_err());
        assert!(IdempotencyKey::parse("café".as_bytes()).is_err());
    }
}
