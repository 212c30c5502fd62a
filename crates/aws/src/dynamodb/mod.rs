//! The production store: one DynamoDB table (see docs/design.md).
//!
//! | item | pk | sk |
//! |---|---|---|
//! | run | `RUN#<run_id>` | `RUN` |
//! | a run's large checkpoint | `RUN#<run_id>` | `CKPT` |
//! | a run's event | `RUN#<run_id>` | `EV#<seq, 12 digits>` |
//! | the owner's list entry of a run | `OWNER#<owner>#<shard>` | `RUN#<run_id>` |
//! | an item of the owner's active-run count (the ids of the runs it counts) | `ACTIVE#<owner>#<0..255>` | `ACTIVE` |
//! | idempotency record | `IDEM#<owner>#<sha256 of the key>` | `IDEM` |
//! | API key | `KEY#<sha256 hex of the key>` | `KEY` |
//! | agent definition | `AGENT#<name>` | `AGENT` |
//! | webhook endpoint | `WEBHOOKS#<owner>` | `WH#<webhook_id>` |
//! | an owner's count of endpoints | `WEBHOOKS#<owner>` | `COUNT` |
//! | a delivery attempt (kept 30 days) | `WH#<webhook_id>` | `DLV#<delivery_id>` |
//! | the claim of a delivery's next attempt (kept 3 days) | `WH#<webhook_id>` | `NEXT#<run_id>#<seq>#<attempt>` |
//!
//! A run's shard is its id's random bits modulo [`OWNER_SHARDS`], its item
//! of the count those bits modulo up to [`COUNTER_SHARDS`]: no key that an
//! owner's creates and ends write takes more than a small share of them,
//! however busy the owner (docs/design.md, "A busy tenant"). The count is
//! written by single writes apart from any transaction, so no two creates
//! or ends can conflict: a place is taken before the run is written and
//! given back after it ends, and the sweeper gives back, within
//! [`RECOUNT_EVERY`], the places a crash between the two writes left
//! taken (items of a count carry `gsi2pk = RECOUNT#<n>`, `gsi2sk = <time of
//! their next recount>` for it). Runs
//! also carry `gsi1pk = OWNER#<owner>#STATUS#<status>#<shard>`, `gsi1sk =
//! RUN#<run_id>` (the status filter) and, while not terminal, `gsi2pk =
//! DUE#<shard>`, `gsi2sk = <due time>#<run_id>#<owner>` (the sweeper's
//! sparse timer index). Every write of a run is conditional on the version
//! it read.
//!
//! The approvals inbox reads a sparse index, `gsi3`, by owner and approval
//! status (projecting the keys and `agent`, which the agent filter reads):
//! a run awaiting approval is the entry of its pending approvals (`gsi3pk =
//! APR#<owner>#pending`, `gsi3sk = <requested_at, 13 digits>#<run_id>`), and
//! the event that gives an approval its final status is that approval's
//! entry (`APR#<owner>#<status>`, `<requested_at>#<run_id>#<approval_id>`).
//! Entries never need updating: the run's entry goes with its status, and a
//! final status never changes. The runs are then read back, so every entry
//! shows the approval as it is now.
//!
//! A checkpoint over [`INLINE_CHECKPOINT_BYTES`] of JSON (an LLM agent's
//! transcript) is kept in its own item, written in the same transaction as
//! the run, so the run item stays small for every read and list and far
//! from DynamoDB's 400 KB item limit.
//!
//! Events are items of their own partition per run, put in the transaction
//! of the change they report: a busy owner's partition does not grow
//! hotter, and a run's log is one Query.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};

mod agents;
mod calls;
mod count;
mod items;
mod keys;
mod migrate;
mod policies;
mod reads;
mod runs;
mod signing_keys;
mod upkeep;
mod webhooks;

pub use migrate::Migrated;
pub use webhooks::{NOTIFIED_EVENT_PREFIX, decode_stream_event};

use agent_runs_ports::store::EventFormat;
use agent_runs_ports::views::ExtraFields;

pub const STATUS_INDEX: &str = "gsi1";
pub const DUE_INDEX: &str = "gsi2";
pub const APPROVALS_INDEX: &str = "gsi3";
/// The tool calls people decided, newest first (approval policies' tests).
pub const DECISIONS_INDEX: &str = "gsi4";
/// Index entries an inbox Query with the agent filter reads at a time.
const INBOX_FILTERED_READ: usize = 1_000;
/// Index entries an inbox page with a kind filter reads per Query, and in
/// all before it answers with what it found and where it stopped: each
/// costs a read of its run (the kind is not in the index).
const KIND_FILTERED_READ: usize = 100;
const KIND_FILTERED_BUDGET: usize = 500;
/// The most items one `TransactWriteItems` may hold.
const MAX_TRANSACTION_ITEMS: usize = 100;
/// The most bytes of items one `TransactWriteItems` is given (DynamoDB
/// allows 4 MB; the estimate below leaves room for what it does not count).
const MAX_TRANSACTION_BYTES: usize = 3_500_000;

/// About how many bytes DynamoDB counts for an attribute value.
fn value_bytes(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) | AttributeValue::N(text) => text.len(),
        AttributeValue::B(blob) => blob.as_ref().len(),
        AttributeValue::M(map) => {
            3 + map.iter().map(|(name, value)| name.len() + 1 + value_bytes(value)).sum::<usize>()
        }
        AttributeValue::L(list) => 3 + list.iter().map(|value| 1 + value_bytes(value)).sum::<usize>(),
        AttributeValue::Ss(texts) | AttributeValue::Ns(texts) => texts.iter().map(String::len).sum(),
        _ => 1,
    }
}

/// About how many bytes of items a write puts.
fn write_bytes(items: &[TransactWriteItem]) -> usize {
    let item = |item: &Item| item.iter().map(|(name, value)| name.len() + value_bytes(value)).sum::<usize>();
    items.iter().filter_map(|write| write.put.as_ref()).map(|put| item(put.item())).sum()
}
/// Partitions of the due index, so the sweeper's reads and the writes of
/// busy periods spread over several keys.
pub const DUE_SHARDS: u32 = 32;
/// Partitions of an owner's list entries and of its status index entries.
pub const OWNER_SHARDS: u32 = 32;
/// The most items of an owner's active-run count: at a busy owner's rate
/// each sees few transactions a second (docs/design.md).
pub const COUNTER_SHARDS: u32 = 256;
/// The fewest active runs each item of the count holds.
const RUNS_PER_COUNTER: u32 = 8;
/// Tries of a create on other shards of the active-run count when the
/// first one it tried is full.
const COUNTER_RETRIES: usize = 3;
/// Items of the count a create reads when its own is full: a few, so that
/// refused creates at the limit do not read every item (docs/design.md).
const COUNTER_SAMPLE: usize = 32;
/// The attribute of an item of the count that holds its runs' ids.
const COUNTED_RUNS: &str = "runs";
const COUNT_SK: &str = "ACTIVE";
/// The number an item of the count held before it held its runs' ids:
/// only [`migrate`] reads it (and removes it).
const LEGACY_COUNT: &str = "active";
/// Items of counts recounted at once by a sweeper pass.
const RECOUNTS_AT_ONCE: usize = 8;
/// How often each item of a count is checked against its runs.
pub const RECOUNT_EVERY: Duration = Duration::from_secs(10 * 60);
/// A place on the count taken this long ago for a run that does not exist
/// is given back: its create is over, since no Lambda invocation lives
/// longer than 15 minutes.
pub const ABANDONED_CREATE: Duration = Duration::from_secs(15 * 60);

/// Larger checkpoints live in their own item.
pub const INLINE_CHECKPOINT_BYTES: usize = 32 * 1024;
/// On a run item: the version whose checkpoint is in the `CKPT#` item.
const CHECKPOINT_APART: &str = "checkpoint_apart";

const TERMINAL: [&str; 3] = ["succeeded", "failed", "canceled"];

/// A projection expression and the attribute names it stands for.
type Projection = (&'static str, &'static [(&'static str, &'static str)]);
/// A run's key and status.
const STATUS_ONLY: Projection = ("pk, #status", &[("#status", "status")]);

/// Every write of a run: still the version read, and not ended.
const UPDATE_CONDITION: &str = "version = :expected AND NOT (#status IN (:t0, :t1, :t2))";

fn update_values(expected_version: u64) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (":expected".to_owned(), n(expected_version)),
        (":t0".to_owned(), s(TERMINAL[0])),
        (":t1".to_owned(), s(TERMINAL[1])),
        (":t2".to_owned(), s(TERMINAL[2])),
    ])
}

/// Sends of a transaction that DynamoDB cancels for a conflict with another
/// transaction or for throttling (the SDK does not retry those), with full
/// jitter exponential backoff between them.
const TRANSACT_ATTEMPTS: u32 = 6;
const TRANSACT_BACKOFF_BASE: Duration = Duration::from_millis(25);
const TRANSACT_BACKOFF_CAP: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    /// What the runs' JSON (lists, events) shows beyond the contract.
    shown: ExtraFields,
    event_format: EventFormat,
    /// Inbox entries a page with a kind filter reads at most.
    kind_filter_budget: usize,
}

type Item = HashMap<String, AttributeValue>;

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

#[cfg(test)]
mod tests {
    use super::items::{count_sample, counter_cap, counter_shard, counter_shards, following_on};
    use super::*;
    use agent_runs_domain::{RunId, Timestamp};
    use agent_runs_ports::store::StoredEvent;

    fn event(seq: u64) -> StoredEvent {
        StoredEvent {
            seq,
            kind: "output.appended".into(),
            at: Timestamp::from_millis(0),
            data: agent_runs_ports::store::EventBody::stored(agent_runs_ports::store::RENDERED_FORMAT, "{}".into()),
        }
    }

    /// A full item's create reads every other item in use where there are
    /// few, else a different random 32 each time, never its own.
    #[test]
    fn a_create_whose_own_item_is_full_reads_a_random_few_of_the_others() {
        for limit in [1, 16, 271, 272, 1_000, 50_000] {
            let items = counter_shards(limit);
            for own in [0, items - 1] {
                let sample = count_sample(own, limit);
                assert_eq!(sample.len(), (items as usize - 1).min(COUNTER_SAMPLE), "limit {limit}");
                assert!(sample.iter().all(|item| *item != own && *item < items), "limit {limit}: {sample:?}");
                let distinct: std::collections::HashSet<_> = sample.iter().collect();
                assert_eq!(distinct.len(), sample.len());
            }
        }
        let seen: std::collections::HashSet<u32> = (0..200).flat_map(|_| count_sample(0, 1_000)).collect();
        assert_eq!(seen.len(), 124, "over many creates every other item in use is read");
    }

    /// The count's items hold the limit exactly between them, at least
    /// eight runs each where the limit allows, on at most 256 items.
    #[test]
    fn the_active_run_limit_is_split_exactly_over_the_counts_items() {
        for limit in [0, 1, 7, 8, 70, 1_000, 2_047, 2_048, 50_000] {
            let caps: Vec<u32> = (0..COUNTER_SHARDS).map(|shard| counter_cap(limit, shard)).collect();
            assert_eq!(caps.iter().sum::<u32>(), limit, "limit {limit}");
            let used = caps.iter().filter(|cap| **cap > 0).count() as u32;
            assert!(used <= counter_shards(limit) && counter_shards(limit) <= COUNTER_SHARDS);
            assert!(limit < RUNS_PER_COUNTER || caps.iter().take(used as usize).all(|cap| *cap >= RUNS_PER_COUNTER));
        }
        let run = RunId::from_ulid(ulid::Ulid::from_parts(1, 12_345));
        assert!(counter_shard(run, 1_000) < counter_shards(1_000));
        assert_eq!(counter_cap(1_000, counter_shard(run, 1_000)), 8, "its own item holds its share");
    }

    /// A Query that saw part of a transaction (seq 4 without 3) answers
    /// only what follows on from `after`: a client never skips an event.
    #[test]
    fn only_events_that_follow_on_without_a_gap_are_answered() {
        let seqs = |after, list: &[u64]| following_on(after, &list.iter().copied().map(event).collect::<Vec<_>>());
        assert_eq!(seqs(0, &[1, 2, 3]), 3);
        assert_eq!(seqs(2, &[3, 5, 6]), 1);
        assert_eq!(seqs(2, &[4, 5]), 0, "the first is missing: nothing yet");
        assert_eq!(seqs(7, &[]), 0);
    }
}
