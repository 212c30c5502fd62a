//! List cursors: opaque to clients, bound to the owner and the status filter
//! they were issued for, and checked so an altered cursor is refused.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use ulid::Ulid;

use crate::approval::{ApprovalKind, ApprovalStatus};
use crate::ids::{ApprovalId, Owner, RunId};
use crate::run_values::RunStatus;
use crate::time::Timestamp;

const VERSION: u8 = 1;
/// A cursor of a thread's list: the thread's id after the status.
const THREAD_VERSION: u8 = 4;
const CHECK_BYTES: usize = 8;
const PAYLOAD_BYTES: usize = 1 + 1 + 16;
const THREAD_PAYLOAD_BYTES: usize = PAYLOAD_BYTES + 16;

/// Where the next page starts: after `last` (exclusive), newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub status: Option<RunStatus>,
    /// The thread filter, if any.
    pub thread: Option<RunId>,
    pub last: RunId,
}

/// Where an inbox page ends: its entries are ordered by these, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InboxPosition {
    pub requested_at: Timestamp,
    pub run_id: RunId,
    pub approval_id: ApprovalId,
}

/// Where the next inbox page starts: after `last` (exclusive), for the
/// filters it was issued with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxCursor {
    pub status: ApprovalStatus,
    pub agent: Option<String>,
    pub kind: Option<ApprovalKind>,
    pub last: InboxPosition,
}

/// The byte of the status filter, with the kind filter in its high half
/// (0 for none, so cursors issued before the kind filter read as without).
fn filter_byte(status: ApprovalStatus, kind: Option<ApprovalKind>) -> u8 {
    let status = ApprovalStatus::ALL.iter().position(|s| *s == status).unwrap_or(0) as u8;
    let kind = kind.and_then(|kind| ApprovalKind::ALL.iter().position(|k| *k == kind)).map_or(0, |k| k as u8 + 1);
    status | kind << 4
}

const INBOX_VERSION: u8 = 2;
const INBOX_PAYLOAD_BYTES: usize = 1 + 1 + 4 + 8 + 16 + 16;

/// Four bytes naming the agent filter, so a cursor used with another one is
/// told apart from an altered cursor.
fn agent_tag(agent: Option<&str>) -> [u8; 4] {
    let digest = Sha256::new().chain_update([u8::from(agent.is_some())]).chain_update(agent.unwrap_or("")).finalize();
    digest[..4].try_into().expect("a SHA-256 digest is 32 bytes")
}

impl InboxCursor {
    pub fn encode(&self, owner: &Owner) -> String {
        let mut bytes = Vec::with_capacity(INBOX_PAYLOAD_BYTES + CHECK_BYTES);
        bytes.push(INBOX_VERSION);
        bytes.push(filter_byte(self.status, self.kind));
        bytes.extend_from_slice(&agent_tag(self.agent.as_deref()));
        bytes.extend_from_slice(&self.last.requested_at.millis().to_be_bytes());
        bytes.extend_from_slice(&self.last.run_id.ulid().to_bytes());
        bytes.extend_from_slice(&self.last.approval_id.ulid().to_bytes());
        sealed(owner, bytes)
    }

    /// Decodes a cursor for `owner` and checks it against the filters of
    /// the request it came with.
    pub fn decode(
        text: &str,
        owner: &Owner,
        status: ApprovalStatus,
        agent: Option<&str>,
        kind: Option<ApprovalKind>,
    ) -> Result<InboxCursor, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError::Malformed)?;
        if bytes.first() != Some(&INBOX_VERSION) {
            return Err(CursorError::Malformed);
        }
        let payload = opened(owner, &bytes, INBOX_PAYLOAD_BYTES)?;
        ApprovalStatus::ALL.get(usize::from(payload[1] & 0x0f)).ok_or(CursorError::Malformed)?;
        if payload[1] != filter_byte(status, kind) || payload[2..6] != agent_tag(agent) {
            return Err(CursorError::FilterMismatch);
        }
        let ulid = |range: std::ops::Range<usize>| -> Result<Ulid, CursorError> {
            Ok(Ulid::from_bytes(payload[range].try_into().map_err(|_| CursorError::Malformed)?))
        };
        let millis = i64::from_be_bytes(payload[6..14].try_into().map_err(|_| CursorError::Malformed)?);
        let last = InboxPosition {
            requested_at: Timestamp::from_millis(millis),
            run_id: RunId::from_ulid(ulid(14..30)?),
            approval_id: ApprovalId::from_ulid(ulid(30..46)?),
        };
        Ok(InboxCursor { status, agent: agent.map(str::to_owned), kind, last })
    }
}

/// Where the next page of a list ordered by id (newest first) starts:
/// after `last`, exclusive. Bound to the owner and to the list it was
/// issued for (`list`: "webhooks", or a webhook's id for its deliveries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdCursor {
    pub last: Ulid,
}

const ID_VERSION: u8 = 3;
const ID_PAYLOAD_BYTES: usize = 1 + 4 + 16;

impl IdCursor {
    pub fn encode(&self, owner: &Owner, list: &str) -> String {
        let mut bytes = Vec::with_capacity(ID_PAYLOAD_BYTES + CHECK_BYTES);
        bytes.push(ID_VERSION);
        bytes.extend_from_slice(&agent_tag(Some(list)));
        bytes.extend_from_slice(&self.last.to_bytes());
        sealed(owner, bytes)
    }

    pub fn decode(text: &str, owner: &Owner, list: &str) -> Result<IdCursor, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError::Malformed)?;
        if bytes.first() != Some(&ID_VERSION) {
            return Err(CursorError::Malformed);
        }
        let payload = opened(owner, &bytes, ID_PAYLOAD_BYTES)?;
        if payload[1..5] != agent_tag(Some(list)) {
            return Err(CursorError::FilterMismatch);
        }
        let last: [u8; 16] = payload[5..].try_into().map_err(|_| CursorError::Malformed)?;
        Ok(IdCursor { last: Ulid::from_bytes(last) })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    #[error(
        "The cursor is not one this service issued, or it was altered. Pass `next_cursor` from an earlier page unchanged."
    )]
    Malformed,
    #[error(
        "The cursor was issued for different filters. Repeat the filters of the first page, or start again without a cursor."
    )]
    FilterMismatch,
}

fn status_code(status: Option<RunStatus>) -> u8 {
    status.map_or(0, |status| RunStatus::ALL.iter().position(|s| *s == status).unwrap_or(0) as u8 + 1)
}

/// `payload` with its owner's checksum, as a cursor's text.
fn sealed(owner: &Owner, mut payload: Vec<u8>) -> String {
    let check = checksum(owner, &payload);
    payload.extend_from_slice(&check);
    URL_SAFE_NO_PAD.encode(payload)
}

/// The payload of `bytes` (`payload_bytes` long), when its checksum is the
/// owner's.
fn opened<'a>(owner: &Owner, bytes: &'a [u8], payload_bytes: usize) -> Result<&'a [u8], CursorError> {
    if bytes.len() != payload_bytes + CHECK_BYTES {
        return Err(CursorError::Malformed);
    }
    let (payload, check) = bytes.split_at(payload_bytes);
    if checksum(owner, payload) == check { Ok(payload) } else { Err(CursorError::Malformed) }
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
        let mut bytes = Vec::with_capacity(THREAD_PAYLOAD_BYTES + CHECK_BYTES);
        bytes.push(if self.thread.is_some() { THREAD_VERSION } else { VERSION });
        bytes.push(status_code(self.status));
        if let Some(thread) = self.thread {
            bytes.extend_from_slice(&thread.ulid().to_bytes());
        }
        bytes.extend_from_slice(&self.last.ulid().to_bytes());
        sealed(owner, bytes)
    }

    /// Decodes a cursor for `owner` and checks it against the `status` and
    /// `thread` filters of the request it came with.
    pub fn decode(
        text: &str,
        owner: &Owner,
        status: Option<RunStatus>,
        thread: Option<RunId>,
    ) -> Result<Cursor, CursorError> {
        let bytes = URL_SAFE_NO_PAD.decode(text).map_err(|_| CursorError::Malformed)?;
        let payload_bytes = match bytes.first() {
            Some(&VERSION) => PAYLOAD_BYTES,
            Some(&THREAD_VERSION) => THREAD_PAYLOAD_BYTES,
            _ => return Err(CursorError::Malformed),
        };
        let payload = opened(owner, &bytes, payload_bytes)?;
        let issued_status = match payload[1] {
            0 => None,
            code => Some(*RunStatus::ALL.get(code as usize - 1).ok_or(CursorError::Malformed)?),
        };
        let id_at = |start: usize| -> Result<RunId, CursorError> {
            let bytes: [u8; 16] = payload[start..start + 16].try_into().map_err(|_| CursorError::Malformed)?;
            Ok(RunId::from_ulid(Ulid::from_bytes(bytes)))
        };
        let issued_thread = (payload_bytes == THREAD_PAYLOAD_BYTES).then(|| id_at(2)).transpose()?;
        if issued_status != status || issued_thread != thread {
            return Err(CursorError::FilterMismatch);
        }
        Ok(Cursor { status, thread, last: id_at(payload_bytes - 16)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str) -> Owner {
        Owner::parse(name).unwrap()
    }

    #[test]
    fn an_id_cursor_is_bound_to_its_owner_and_list() {
        let cursor = IdCursor { last: Ulid::from_parts(1_795_303_478_123, 7) };
        let text = cursor.encode(&owner("acme"), "webhooks");
        assert_eq!(IdCursor::decode(&text, &owner("acme"), "webhooks"), Ok(cursor));
        assert_eq!(IdCursor::decode(&text, &owner("acme"), "wh_x"), Err(CursorError::FilterMismatch));
        assert_eq!(IdCursor::decode(&text, &owner("other"), "webhooks"), Err(CursorError::Malformed));
        let runs_cursor =
            Cursor { status: None, thread: None, last: RunId::from_ulid(cursor.last) }.encode(&owner("acme"));
        assert_eq!(IdCursor::decode(&runs_cursor, &owner("acme"), "webhooks"), Err(CursorError::Malformed));
    }

    #[test]
    fn round_trips_for_every_filter() {
        let last = RunId::from_ulid(Ulid::from_parts(1_795_303_478_123, 7));
        for status in std::iter::once(None).chain(RunStatus::ALL.map(Some)) {
            let text = Cursor { status, thread: None, last }.encode(&owner("acme"));
            assert_eq!(Cursor::decode(&text, &owner("acme"), status, None), Ok(Cursor { status, thread: None, last }));
        }
    }

    #[test]
    fn an_inbox_cursor_round_trips_and_is_bound_to_its_owner_and_filters() {
        let last = InboxPosition {
            requested_at: Timestamp::from_millis(1_795_303_478_123),
            run_id: RunId::from_ulid(Ulid::from_parts(1_795_303_478_000, 7)),
            approval_id: ApprovalId::from_ulid(Ulid::from_parts(1_795_303_478_123, 9)),
        };
        let cursor = InboxCursor { status: ApprovalStatus::Pending, agent: Some("ops".into()), kind: None, last };
        let text = cursor.encode(&owner("acme"));
        let decode =
            |owner_name: &str, status, agent| InboxCursor::decode(&text, &owner(owner_name), status, agent, None);
        assert_eq!(decode("acme", ApprovalStatus::Pending, Some("ops")), Ok(cursor.clone()));
        assert_eq!(decode("acme", ApprovalStatus::Approved, Some("ops")), Err(CursorError::FilterMismatch));
        assert_eq!(decode("acme", ApprovalStatus::Pending, None), Err(CursorError::FilterMismatch));
        assert_eq!(decode("acme", ApprovalStatus::Pending, Some("op")), Err(CursorError::FilterMismatch));
        assert_eq!(decode("other", ApprovalStatus::Pending, Some("ops")), Err(CursorError::Malformed));
        // The kind filter is bound too.
        let questions = InboxCursor { kind: Some(ApprovalKind::Input), ..cursor.clone() };
        let text = questions.encode(&owner("acme"));
        let decode = |kind| InboxCursor::decode(&text, &owner("acme"), ApprovalStatus::Pending, Some("ops"), kind);
        assert_eq!(decode(Some(ApprovalKind::Input)), Ok(questions.clone()));
        assert_eq!(decode(None), Err(CursorError::FilterMismatch));
        assert_eq!(decode(Some(ApprovalKind::ToolCall)), Err(CursorError::FilterMismatch));
        let answered = InboxCursor { status: ApprovalStatus::Answered, ..questions };
        let text = answered.encode(&owner("acme"));
        let decoded = InboxCursor::decode(&text, &owner("acme"), ApprovalStatus::Answered, Some("ops"), answered.kind);
        assert_eq!(decoded, Ok(answered));
        let runs_cursor = Cursor { status: None, thread: None, last: last.run_id }.encode(&owner("acme"));
        assert_eq!(
            InboxCursor::decode(&runs_cursor, &owner("acme"), ApprovalStatus::Pending, None, None),
            Err(CursorError::Malformed)
        );
    }

    #[test]
    fn a_thread_cursor_is_bound_to_its_thread_and_status() {
        let id = |n| RunId::from_ulid(Ulid::from_parts(1_795_303_478_123, n));
        let (thread, last) = (id(1), id(9));
        let acme = owner("acme");
        for status in [None, Some(RunStatus::Succeeded)] {
            let text = Cursor { status, thread: Some(thread), last }.encode(&acme);
            assert_eq!(
                Cursor::decode(&text, &acme, status, Some(thread)),
                Ok(Cursor { status, thread: Some(thread), last })
            );
            assert_eq!(Cursor::decode(&text, &acme, status, Some(id(2))), Err(CursorError::FilterMismatch));
            assert_eq!(Cursor::decode(&text, &acme, status, None), Err(CursorError::FilterMismatch));
            assert_eq!(Cursor::decode(&text, &owner("other"), status, Some(thread)), Err(CursorError::Malformed));
        }
        let unthreaded = Cursor { status: None, thread: None, last }.encode(&acme);
        assert_eq!(Cursor::decode(&unthreaded, &acme, None, Some(thread)), Err(CursorError::FilterMismatch));
    }

    #[test]
    fn refuses_other_filters_owners_and_any_altered_character() {
        let last = RunId::from_ulid(Ulid::from_parts(1_795_303_478_123, 7));
        let text = Cursor { status: Some(RunStatus::Queued), thread: None, last }.encode(&owner("acme"));
        assert_eq!(Cursor::decode(&text, &owner("acme"), None, None), Err(CursorError::FilterMismatch));
        assert_eq!(
            Cursor::decode(&text, &owner("acme"), Some(RunStatus::Failed), None),
            Err(CursorError::FilterMismatch)
        );
        assert_eq!(Cursor::decode(&text, &owner("other"), Some(RunStatus::Queued), None), Err(CursorError::Malformed));
        for i in 0..text.len() {
            let mut altered = text.clone().into_bytes();
            altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(altered).unwrap();
            assert!(Cursor::decode(&altered, &owner("acme"), Some(RunStatus::Queued), None).is_err());
        }
        for junk in ["", "abc", "!!!!", &text[..text.len() - 1]] {
            assert!(Cursor::decode(junk, &owner("acme"), Some(RunStatus::Queued), None).is_err());
        }
    }
}
