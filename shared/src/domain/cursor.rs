//! List cursors: opaque to clients, bound to the owner and the status filter
//! they were issued for, and checked so an altered cursor is refused.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use ulid::Ulid;

use super::{Owner, RunId, RunStatus};

const VERSION: u8 = 1;
const CHECK_BYTES: usize = 8;
const PAYLOAD_BYTES: usize = 1 + 1 + 16;

/// Where the next page starts: after `last` (exclusive), newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub status: Option<RunStatus>,
    pub last: RunId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error(
        "The cursor is not one this service issued, or it was altered. Pass `next_cursor` from an earlier page unchanged."
    )]
    Malformed,
    #[error(
        "The cursor was issued for a different `status` filter. Repeat the filter of the first page, or start again without a cursor."
    )]
    FilterMismatch,
}

fn status_code(status: Option<RunStatus>) -> u8 {
    status.map_or(0, |status| RunStatus::ALL.iter().position(|s| *s == status).unwrap_or(0) as u8 + 1)
}

fn checksum(owner: &Owner, payload: &[u8]) -> [u8; CHECK_BYTES] {
    let digest = Sha256::new()
        .chain_update(b"agent-runs cursor v1\0")
        .chain_update(owner.as_str().as_bytes())
        .chain_update([0])
        .chain_update(payload)
        .finalize();
    digest[..CHECK_BYTES].try_into().expect("a SHA-256 digest is 32 bytes")
}

impl Cursor {
    pub fn encode(&self, owner: &Owner) -> String {
        let mut bytes = Vec::with_capacity(PAYLOAD_BYTES + CHECK_BYTES);
        bytes.push(VERSION);
        bytes.push(status_code(self.status));
        bytes.extend_from_slice(&self.last.ulid().to_bytes());
        let check = checksum(owner, &bytes);
        bytes.extend_from_slice(&check);
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// Decodes a cursor for `owner` and checks it against the `status` filter
    /// of the request it came with.
    pub fn decode(text: &str, owner: &Owner, status: Option<RunStatus>) -> Result<Cursor, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError::Malformed)?;
        if bytes.len() != PAYLOAD_BYTES + CHECK_BYTES || bytes[0] != VERSION {
            return Err(CursorError::Malformed);
        }
        let (payload, check) = bytes.split_at(PAYLOAD_BYTES);
        if checksum(owner, payload) != check {
            return Err(CursorError::Malformed);
        }
        let issued_status = match payload[1] {
            0 => None,
            code => Some(*RunStatus::ALL.get(code as usize - 1).ok_or(CursorError::Malformed)?),
        };
        if issued_status != status {
            return Err(CursorError::FilterMismatch);
        }
        let ulid_bytes: [u8; 16] = payload[2..].try_into().map_err(|_| CursorError::Malformed)?;
        Ok(Cursor { status, last: RunId::from_ulid(Ulid::from_bytes(ulid_bytes)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str) -> Owner {
        Owner::parse(name).unwrap()
    }

    #[test]
    fn round_trips_for_every_filter() {
        let last = RunId::from_ulid(Ulid::from_parts(1_795_303_478_123, 7));
        for status in std::iter::once(None).chain(RunStatus::ALL.map(Some)) {
            let text = Cursor { status, last }.encode(&owner("acme"));
            assert_eq!(Cursor::decode(&text, &owner("acme"), status), Ok(Cursor { status, last }));
        }
    }

    #[test]
    fn refuses_other_filters_owners_and_any_altered_character() {
        let last = RunId::from_ulid(Ulid::from_parts(1_795_303_478_123, 7));
        let text = Cursor { status: Some(RunStatus::Queued), last }.encode(&owner("acme"));
        assert_eq!(Cursor::decode(&text, &owner("acme"), None), Err(CursorError::FilterMismatch));
        assert_eq!(Cursor::decode(&text, &owner("acme"), Some(RunStatus::Failed)), Err(CursorError::FilterMismatch));
        assert_eq!(Cursor::decode(&text, &owner("other"), Some(RunStatus::Queued)), Err(CursorError::Malformed));
        for i in 0..text.len() {
            let mut altered = text.clone().into_bytes();
            altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).unwrap();
            assert!(Cursor::decode(&altered, &owner("acme"), Some(RunStatus::Queued)).is_err());
        }
        for junk in ["", "abc", "!!!!", &text[..text.len() - 1]] {
            assert!(Cursor::decode(junk, &owner("acme"), Some(RunStatus::Queued)).is_err());
        }
    }
}
