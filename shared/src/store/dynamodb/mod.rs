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

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem, Update};
use rand::Rng;

mod agents;
mod count;
mod keys;
mod migrate;
mod reads;
mod runs;
mod upkeep;
mod webhooks;

pub use migrate::Migrated;
pub use webhooks::{NOTIFIED_EVENT_PREFIX, decode_stream_event};

use super::record::StoredRun;
use super::{
    BatchWriteError, DueRun, EventLog, EventPage, IdempotencyClaim, IdempotencyRecord, InboxEntry, InboxPage,
    InboxRequest, InsertOutcome, ListPage, ListRequest, Run, RunKey, RunLists, RunStore, Settled, StoreError,
    StoredEvent, Upkeep, ViewPage, views_of,
};
use crate::domain::{Approval, ApprovalId, ApprovalStatus, Event, EventData, Owner, RunId, RunStatus, Timestamp};

pub const STATUS_INDEX: &str = "gsi1";
pub const DUE_INDEX: &str = "gsi2";
pub const APPROVALS_INDEX: &str = "gsi3";
/// Index entries an inbox Query with the agent filter reads at a time.
const INBOX_FILTERED_READ: usize = 1_000;
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
/// The largest checkpoint that fits in an item of its own.
pub const MAX_CHECKPOINT_BYTES: usize = 350_000;
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
}

type Item = HashMap<String, AttributeValue>;

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// The run's shard of its owner's keys.
fn shard(run_id: RunId) -> u32 {
    (run_id.ulid().random() % u128::from(OWNER_SHARDS)) as u32
}

const RUN_SK: &str = "RUN";
const CHECKPOINT_SK: &str = "CKPT";

/// The partition of a run, its checkpoint and its events.
fn run_pk(run_id: RunId) -> String {
    format!("RUN#{run_id}")
}

/// The key of the owner's list entry of a run, which is the whole entry.
fn entry(owner: &Owner, run_id: RunId) -> Item {
    Item::from([("pk".into(), s(format!("OWNER#{owner}#{}", shard(run_id)))), ("sk".into(), s(run_sk(run_id)))])
}

fn run_sk(run_id: RunId) -> String {
    format!("RUN#{run_id}")
}

fn status_pk(owner: &Owner, status: RunStatus, shard: u32) -> String {
    format!("OWNER#{owner}#STATUS#{}#{shard}", status.as_str())
}

fn counter_pk(owner: &Owner, shard: u32) -> String {
    format!("ACTIVE#{owner}#{shard}")
}

fn idempotency_pk(owner: &Owner, key_hash: &str) -> String {
    format!("IDEM#{owner}#{key_hash}")
}

/// How many items of the count `limit` active runs are split over: each
/// holds at least [`RUNS_PER_COUNTER`], up to [`COUNTER_SHARDS`] items.
fn counter_shards(limit: u32) -> u32 {
    (limit / RUNS_PER_COUNTER).clamp(1, COUNTER_SHARDS)
}

/// The most of `limit` active runs item `shard` of the count holds: the
/// limit split evenly over [`counter_shards`], any remainder on the first.
fn counter_cap(limit: u32, shard: u32) -> u32 {
    let shards = counter_shards(limit);
    if shard >= shards {
        return 0;
    }
    limit / shards + u32::from(shard < limit % shards)
}

/// The run's own item of the count, under `limit`: the one its create tries
/// first and its end gives back to.
fn counter_shard(run_id: RunId, limit: u32) -> u32 {
    (run_id.ulid().random() % u128::from(counter_shards(limit))) as u32
}

/// The items a create whose own item `own` found full reads: up to
/// [`COUNTER_SAMPLE`] others of those in use under `limit`, at random.
fn count_sample(own: u32, limit: u32) -> Vec<u32> {
    let mut sample: Vec<u32> = (0..counter_shards(limit)).filter(|item| *item != own).collect();
    rand::seq::SliceRandom::shuffle(sample.as_mut_slice(), &mut rand::rng());
    sample.truncate(COUNTER_SAMPLE);
    sample
}

/// The item of the count that `run`'s create took (runs from before items
/// were recorded: their own item under the default limit).
fn count_item(run: &Run) -> u32 {
    run.count_item.unwrap_or_else(|| counter_shard(run.id, super::DEFAULT_MAX_ACTIVE_RUNS))
}

/// The ids an item of the count holds.
fn counted_runs(item: &Item) -> Vec<String> {
    item.get(COUNTED_RUNS).and_then(|runs| runs.as_ss().ok()).cloned().unwrap_or_default()
}

/// The due index partition where item `item` of any owner's count waits
/// for its recount.
fn recount_pk(item: u32) -> String {
    format!("RECOUNT#{}", item % DUE_SHARDS)
}

fn due_sk(due_at: Timestamp, run_id: RunId, owner: &Owner) -> String {
    format!("{}#{run_id}#{owner}", due_at.to_rfc3339())
}

fn due_shard(run_id: RunId) -> u32 {
    ((run_id.ulid().random() >> 16) % u128::from(DUE_SHARDS)) as u32
}

fn unavailable<E: std::error::Error + Send + Sync + 'static>(error: E) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

/// `error`, of a call made before a write was sent: the write surely did
/// not happen.
fn not_written(error: StoreError) -> StoreError {
    match error {
        StoreError::Unavailable(source) => StoreError::Refused(source),
        other => other,
    }
}

fn defect(what: impl std::fmt::Display) -> StoreError {
    StoreError::Defect(what.to_string())
}

fn event_sk(seq: u64) -> String {
    format!("EV#{seq:012}")
}

/// The inbox index's sort key: `<requested_at, 13 digits>#<run_id>`, and
/// `#<approval_id>` for one approval's entry (or a cursor's position).
fn inbox_sort_key(requested_at: Timestamp, run_id: RunId, approval: Option<ApprovalId>) -> String {
    let key = format!("{:013}#{run_id}", requested_at.millis().max(0));
    match approval {
        Some(approval) => format!("{key}#{approval}"),
        None => key,
    }
}

/// The inbox index keys of `run`'s approvals with `status` (the sort key
/// of one approval, or of all of the run's pending ones when `None`).
fn inbox_keys(run: &Run, status: ApprovalStatus, requested_at: Timestamp, approval: Option<ApprovalId>) -> Item {
    let status = status.as_str();
    let sort = inbox_sort_key(requested_at, run.id, approval);
    Item::from([
        ("gsi3pk".into(), s(format!("APR#{}#{status}", run.owner))),
        ("gsi3sk".into(), s(sort)),
        ("agent".into(), s(&run.agent)),
    ])
}

/// The event's item; the event that gives an approval its final status
/// is also that approval's inbox entry.
fn event_put(table: &str, run: &Run, event: &Event) -> Result<TransactWriteItem, StoreError> {
    let inbox = match &event.data {
        EventData::ApprovalDecided(approval)
        | EventData::ApprovalExpired(approval)
        | EventData::ApprovalCanceled(approval) => {
            Some(inbox_keys(run, approval.status, approval.requested_at, Some(approval.id)))
        }
        _ => None,
    };
    let put = Put::builder()
        .table_name(table)
        .set_item(inbox)
        .item("pk", s(run_pk(event.run_id)))
        .item("sk", s(event_sk(event.seq)))
        .item("seq", n(event.seq))
        .item("type", s(event.data.kind()))
        .item("at", n(event.at.millis()))
        .item("data", s(crate::views::event_data_json(&event.data)))
        // Whose it is, for the webhook notifier reading the table's stream.
        .item("owner", s(run.owner.as_str()))
        // A seq is never written twice; should the run's count be wrong,
        // the write fails rather than overwrite the log.
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .map_err(defect)?;
    Ok(TransactWriteItem::builder().put(put).build())
}

fn decode_event(item: &Item) -> Result<StoredEvent, StoreError> {
    let number = |name: &str| -> Result<i64, StoreError> {
        item.get(name)
            .and_then(|value| value.as_n().ok())
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| defect(format!("event item without a numeric {name}")))
    };
    Ok(StoredEvent {
        seq: number("seq")? as u64,
        kind: text(item, "type")?.to_owned(),
        at: Timestamp::from_millis(number("at")?),
        data: text(item, "data")?.to_owned(),
    })
}

/// How many of `events` follow on from `after` without a gap.
fn following_on(after: u64, events: &[StoredEvent]) -> usize {
    events.iter().zip(after + 1..).take_while(|(event, seq)| event.seq == *seq).count()
}

/// The run's item and, when its checkpoint is too large to keep inline, the
/// checkpoint's own item.
fn run_items(run: &Run) -> Result<(Item, Option<Item>), StoreError> {
    let apart = match &run.checkpoint {
        Some(checkpoint) => {
            let json = serde_json::to_string(checkpoint).map_err(defect)?;
            if json.len() > MAX_CHECKPOINT_BYTES {
                return Err(defect(format!("a checkpoint of {} bytes is over the limit", json.len())));
            }
            (json.len() > INLINE_CHECKPOINT_BYTES).then_some(json)
        }
        None => None,
    };
    let mut item = run_item(run)?;
    let Some(json) = apart else {
        return Ok((item, None));
    };
    item.remove("checkpoint");
    item.insert(CHECKPOINT_APART.into(), n(run.version));
    let checkpoint = Item::from([
        ("pk".into(), s(run_pk(run.id))),
        ("sk".into(), s(CHECKPOINT_SK)),
        ("version".into(), n(run.version)),
        ("checkpoint".into(), s(json)),
    ]);
    Ok((item, Some(checkpoint)))
}

fn run_item(run: &Run) -> Result<Item, StoreError> {
    let mut item: Item =
        serde_dynamo::to_item(StoredRun::from(run)).map_err(|error| defect(format!("cannot encode run: {error}")))?;
    item.insert("pk".into(), s(run_pk(run.id)));
    item.insert("sk".into(), s(RUN_SK));
    item.insert("gsi1pk".into(), s(status_pk(&run.owner, run.status, shard(run.id))));
    item.insert("gsi1sk".into(), s(run_sk(run.id)));
    if let Some(due_at) = run.due_at {
        item.insert("gsi2pk".into(), s(format!("DUE#{}", due_shard(run.id))));
        item.insert("gsi2sk".into(), s(due_sk(due_at, run.id, &run.owner)));
    }
    let pending = run.approvals.iter().filter(|approval| approval.status == ApprovalStatus::Pending);
    if let (RunStatus::AwaitingApproval, Some(requested_at)) = (run.status, pending.map(|a| a.requested_at).max()) {
        item.extend(inbox_keys(run, ApprovalStatus::Pending, requested_at, None));
    }
    Ok(item)
}

fn decode_run(mut item: Item) -> Result<Run, StoreError> {
    for key in ["pk", "sk", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "gsi3pk", "gsi3sk", CHECKPOINT_APART] {
        item.remove(key);
    }
    serde_dynamo::from_item::<_, StoredRun>(item)
        .map_err(|error| defect(format!("cannot decode stored run: {error}")))?
        .try_into()
}

/// A due index entry and its sort key, by which entries are merged.
fn decode_due(item: &Item) -> Result<(String, DueRun), StoreError> {
    let sort_key = text(item, "gsi2sk")?;
    let mut parts = sort_key.splitn(3, '#');
    let (Some(due_text), Some(run_text), Some(owner)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(defect("malformed gsi2sk"));
    };
    let due_at = chrono::DateTime::parse_from_rfc3339(due_text).map_err(|_| defect("malformed due time"))?;
    let due = DueRun {
        due_at: Timestamp::from_millis(due_at.timestamp_millis()),
        key: RunKey {
            owner: Owner::parse(owner).map_err(|_| defect("malformed owner"))?,
            run_id: run_text.parse().map_err(|_| defect("malformed run id"))?,
        },
    };
    Ok((sort_key.to_owned(), due))
}

/// An inbox index entry.
struct InboxIndexEntry {
    requested_at: i64,
    run_id: RunId,
    /// The approval, when the entry is one approval's; `None` for a run
    /// awaiting approval, whose entry is its pending ones requested then.
    approval: Option<ApprovalId>,
}

fn decode_inbox_entry(item: &Item) -> Result<InboxIndexEntry, StoreError> {
    let mut parts = text(item, "gsi3sk")?.split('#');
    let requested_at = parts.next().and_then(|at| at.parse().ok()).ok_or_else(|| defect("malformed inbox time"))?;
    let run_id = parts.next().and_then(|id| id.parse().ok()).ok_or_else(|| defect("malformed inbox run id"))?;
    let approval = parts.next().map(|id| id.parse().map_err(|_| defect("malformed inbox approval id"))).transpose()?;
    Ok(InboxIndexEntry { requested_at, run_id, approval })
}

fn text<'a>(item: &'a Item, name: &str) -> Result<&'a str, StoreError> {
    item.get(name)
        .and_then(|value| value.as_s().ok())
        .map(String::as_str)
        .ok_or_else(|| defect(format!("item without {name}")))
}

/// Why DynamoDB canceled a transaction, from its reasons (one per item, in
/// order; `None` for an item that was fine).
enum Cancellation {
    /// These items' conditions were false (`true` at their positions).
    ConditionsFailed(Vec<bool>),
    /// Another transaction held an item, or the table was throttled: nothing
    /// was written, and the same transaction may be sent again.
    Retryable,
}

fn cancellation(error: &SdkError<TransactWriteItemsError>) -> Option<Cancellation> {
    let TransactWriteItemsError::TransactionCanceledException(canceled) = error.as_service_error()? else {
        return None;
    };
    let codes: Vec<Option<&str>> = canceled.cancellation_reasons().iter().map(|reason| reason.code()).collect();
    if codes.contains(&Some("ConditionalCheckFailed")) {
        return Some(Cancellation::ConditionsFailed(
            codes.iter().map(|code| *code == Some("ConditionalCheckFailed")).collect(),
        ));
    }
    let retryable = |code: &Option<&str>| {
        matches!(code, Some("TransactionConflict" | "ThrottlingError" | "ProvisionedThroughputExceeded"))
    };
    codes.iter().any(retryable).then_some(Cancellation::Retryable)
}

/// How a transaction that was not written failed.
enum TransactFailure {
    /// These items' conditions were false (`true` at their positions).
    ConditionsFailed(Vec<bool>),
    /// Canceled for conflicts or throttling each time it was sent: nothing
    /// was written.
    Refused(StoreError),
    /// It may or may not have been written (a timeout, an outage).
    Store(StoreError),
}

/// A random wait of up to `base * 2^(attempt - 1)`, capped ("full jitter").
fn transact_backoff(attempt: u32) -> Duration {
    let ceiling = TRANSACT_BACKOFF_BASE.saturating_mul(1 << (attempt - 1).min(16)).min(TRANSACT_BACKOFF_CAP);
    ceiling.mul_f64(rand::rng().random::<f64>())
}

/// `send`'s outcome, sent again (with [`transact_backoff`], up to
/// [`TRANSACT_ATTEMPTS`] sends) while its error is one that `wrote_nothing`
/// says left no effect: a conflict with a transaction, or throttling.
async fn resent<T, E, F>(mut send: impl FnMut() -> F, wrote_nothing: impl Fn(&E) -> bool) -> Result<T, E>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match send().await {
            Err(error) if attempt < TRANSACT_ATTEMPTS && wrote_nothing(&error) => {
                tokio::time::sleep(transact_backoff(attempt)).await;
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self { client, table: table.into() }
    }

    /// A read of an item that never exists (API key lookups use the same
    /// permission), to open the connection to DynamoDB.
    pub async fn warm_up(&self) {
        let _ =
            self.client.get_item().table_name(&self.table).key("pk", s("KEY#warm-up")).key("sk", s("KEY")).send().await;
    }

    async fn get_item(&self, pk: String, sk: String) -> Result<Option<Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(output.item)
    }

    /// Every item with this sort key: an admin operation over a handful of
    /// items, where a filtered scan is fine.
    async fn scan_kind(&self, sort_key: &str) -> Result<Vec<Item>, StoreError> {
        self.scan_filtered("sk = :kind", [(":kind", s(sort_key))]).await
    }

    /// Every item `filter` keeps, by a consistent Scan of the whole table:
    /// for admin operations only.
    async fn scan_filtered<const N: usize>(
        &self,
        filter: &str,
        values: [(&str, AttributeValue); N],
    ) -> Result<Vec<Item>, StoreError> {
        let scan = self
            .client
            .scan()
            .table_name(&self.table)
            .filter_expression(filter)
            .set_expression_attribute_values(Some(values.map(|(name, value)| (name.to_owned(), value)).into()))
            .consistent_read(true);
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let output = scan.clone().set_exclusive_start_key(start).send().await.map_err(unavailable)?;
            items.extend(output.items.unwrap_or_default());
            start = output.last_evaluated_key;
            if start.is_none() {
                return Ok(items);
            }
        }
    }

    /// `next` (the run as it is to be stored, version bumped) and its
    /// events in one transaction, on the condition that the stored run is
    /// still `run`'s version and not terminal.
    async fn update_in_transaction(&self, run: &Run, next: &Run, events: &[Event]) -> Result<(), TransactFailure> {
        let items = self.update_items(run, next, events).map_err(TransactFailure::Store)?;
        self.transact(items).await
    }

    fn update_items(&self, run: &Run, next: &Run, events: &[Event]) -> Result<Vec<TransactWriteItem>, StoreError> {
        let (run_item, checkpoint_item) = run_items(next)?;
        let put_run = Put::builder()
            .table_name(&self.table)
            .set_item(Some(run_item))
            .condition_expression(UPDATE_CONDITION)
            .expression_attribute_names("#status", "status")
            .set_expression_attribute_values(Some(update_values(run.version)))
            .build()
            .map_err(defect)?;
        let mut items = vec![TransactWriteItem::builder().put(put_run).build()];
        if let Some(checkpoint) = checkpoint_item {
            let put = Put::builder().table_name(&self.table).set_item(Some(checkpoint)).build().map_err(defect)?;
            items.push(TransactWriteItem::builder().put(put).build());
        }
        if next.status.is_terminal() {
            // The run's checkpoint item, if it ever had one, is no longer needed.
            let delete = Delete::builder()
                .table_name(&self.table)
                .key("pk", s(run_pk(run.id)))
                .key("sk", s(CHECKPOINT_SK))
                .build()
                .map_err(defect)?;
            items.push(TransactWriteItem::builder().delete(delete).build());
        }
        for event in events {
            items.push(event_put(&self.table, next, event)?);
        }
        Ok(items)
    }

    /// The owner's runs of these ids that exist, read consistently (without
    /// a checkpoint kept apart).
    async fn get_runs(
        &self,
        owner: &Owner,
        run_ids: impl Iterator<Item = RunId>,
    ) -> Result<HashMap<RunId, Run>, StoreError> {
        let mut wanted: Vec<RunId> = run_ids.collect();
        wanted.sort_unstable();
        wanted.dedup();
        let keys =
            wanted.iter().map(|run_id| Item::from([("pk".into(), s(run_pk(*run_id))), ("sk".into(), s(RUN_SK))]));
        let mut runs = HashMap::with_capacity(wanted.len());
        for item in self.batch_get(keys.collect(), None).await? {
            let run = decode_run(item)?;
            // A run is found by its id alone: another owner's is not there.
            if run.owner == *owner {
                runs.insert(run.id, run);
            }
        }
        Ok(runs)
    }

    /// The items of these keys that exist (only the attributes `projection`
    /// names, when given), read consistently, by `BatchGetItem`s of up to
    /// 100 keys.
    async fn batch_get(&self, keys: Vec<Item>, projection: Option<Projection>) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(100) {
            let mut request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                .set_keys(Some(chunk.to_vec()))
                .consistent_read(true);
            if let Some((expression, names)) = projection {
                request = request.projection_expression(expression);
                for (name, attribute) in names {
                    request = request.expression_attribute_names(*name, *attribute);
                }
            }
            let mut request = Some(request.build().map_err(defect)?);
            for attempt in 0..8u32 {
                let Some(keys) = request.take() else { break };
                if attempt > 0 {
                    // Keys left unprocessed (throttling): back off before asking again.
                    tokio::time::sleep(Duration::from_millis(25 << attempt.min(5))).await;
                }
                let output =
                    self.client.batch_get_item().request_items(&self.table, keys).send().await.map_err(unavailable)?;
                found.extend(output.responses.unwrap_or_default().remove(&self.table).unwrap_or_default());
                request = output.unprocessed_keys.unwrap_or_default().remove(&self.table);
            }
            if request.is_some() {
                return Err(unavailable(std::io::Error::other("items stayed unprocessed in BatchGetItem")));
            }
        }
        Ok(found)
    }

    /// The `seq` of the run's last stored event (0 when none).
    async fn last_event_seq(&self, run_id: RunId) -> Result<u64, StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :events)")
            .expression_attribute_values(":pk", s(run_pk(run_id)))
            .expression_attribute_values(":events", s("EV#"))
            .scan_index_forward(false)
            .consistent_read(true);
        let last = self.query_up_to(query, None, 1, |item| decode_event(&item)).await?;
        Ok(last.first().map_or(0, |event| event.seq))
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// A new run's writes: the run, its idempotency record, its list entry
    /// and its events (taken from `written`).
    fn create_items(
        &self,
        written: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let events = written.take_events();
        let put_run = Put::builder()
            .table_name(&self.table)
            .set_item(Some(run_item(written)?))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(defect)?;
        let mut items = vec![TransactWriteItem::builder().put(put_run).build()];
        if let Some(claim) = idempotency {
            let record = Put::builder()
                .table_name(&self.table)
                .item("pk", s(idempotency_pk(&written.owner, &claim.key_hash)))
                .item("sk", s("IDEM"))
                .item("request_hash", s(&claim.request_hash))
                .item("run_id", s(written.id.to_string()))
                .item("created_at", n(claim.created_at.millis()))
                // DynamoDB's TTL wants seconds; reads compare it too, since
                // TTL deletion lags by up to days.
                .item("expires_at", n(claim.expires_at.millis() / 1_000))
                .condition_expression("attribute_not_exists(pk) OR expires_at <= :now")
                .expression_attribute_values(":now", n(claim.created_at.millis() / 1_000))
                .build()
                .map_err(defect)?;
            items.push(TransactWriteItem::builder().put(record).build());
        }
        let put_entry = Put::builder()
            .table_name(&self.table)
            .set_item(Some(entry(&written.owner, written.id)))
            .build()
            .map_err(defect)?;
        items.push(TransactWriteItem::builder().put(put_entry).build());
        for event in &events {
            items.push(event_put(&self.table, written, event)?);
        }
        Ok(items)
    }

    /// The record of the claim's idempotency key, unless there is none or
    /// it expired by the claim's time.
    async fn idempotency_record(
        &self,
        owner: &Owner,
        claim: &IdempotencyClaim,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let Some(record) = self.get_item(idempotency_pk(owner, &claim.key_hash), "IDEM".into()).await? else {
            return Ok(None);
        };
        let expires_at = record.get("expires_at").and_then(|value| value.as_n().ok()).and_then(|n| n.parse().ok());
        if expires_at.is_none_or(|expires_at: i64| expires_at <= claim.created_at.millis() / 1_000) {
            return Ok(None);
        }
        let run_id = text(&record, "run_id")?.parse().map_err(|_| defect("malformed run id in idempotency record"))?;
        let request_hash = text(&record, "request_hash")?.to_owned();
        Ok(Some(IdempotencyRecord { request_hash, run_id }))
    }

    /// Writes `items` in one transaction, sent again while DynamoDB cancels
    /// it only for conflicts or throttling.
    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), TransactFailure> {
        let request = self.client.transact_write_items().set_transact_items(Some(items));
        let retryable = |error: &_| matches!(cancellation(error), Some(Cancellation::Retryable));
        let Err(error) = resent(|| request.clone().send(), retryable).await else {
            return Ok(());
        };
        match cancellation(&error) {
            Some(Cancellation::ConditionsFailed(failed)) => Err(TransactFailure::ConditionsFailed(failed)),
            Some(Cancellation::Retryable) => Err(TransactFailure::Refused(StoreError::Refused(Box::new(error)))),
            None => Err(TransactFailure::Store(unavailable(error))),
        }
    }

    /// The `count` newest items of several partitions (each query reads
    /// one, newest first), by their sort key `sort`. Each partition is read
    /// a few items at a time, all at once, and read on only while what it
    /// has not given could still be among the newest.
    async fn newest_across(
        &self,
        queries: Vec<QueryFluentBuilder>,
        sort: &str,
        count: usize,
    ) -> Result<Vec<Item>, StoreError> {
        struct Partition {
            query: QueryFluentBuilder,
            items: Vec<Item>,
            start: Option<Item>,
            done: bool,
        }
        let mut partitions: Vec<Partition> =
            queries.into_iter().map(|query| Partition { query, items: Vec::new(), start: None, done: false }).collect();
        let mut page = (2 * count).div_ceil(partitions.len().max(1)).max(2);
        let mut reading: Vec<usize> = (0..partitions.len()).collect();
        loop {
            let reads = reading.iter().map(|&at| {
                let partition = &partitions[at];
                partition.query.clone().set_exclusive_start_key(partition.start.clone()).limit(page as i32).send()
            });
            let outputs = futures_util::future::try_join_all(reads).await.map_err(unavailable)?;
            for (&at, output) in reading.iter().zip(outputs) {
                let partition = &mut partitions[at];
                partition.items.extend(output.items.unwrap_or_default());
                partition.start = output.last_evaluated_key;
                partition.done = partition.start.is_none();
            }
            let mut keys: Vec<&str> = Vec::new();
            for partition in &partitions {
                for item in &partition.items {
                    keys.push(text(item, sort)?);
                }
            }
            keys.sort_unstable_by(|a, b| b.cmp(a));
            // The oldest key that is among the newest `count`, once as many are read.
            let boundary = keys.get(count - 1).map(|key| key.to_string());
            reading = (0..partitions.len())
                .filter(|&at| {
                    let partition = &partitions[at];
                    let oldest = partition.items.last().and_then(|item| text(item, sort).ok());
                    !partition.done
                        && match (&boundary, oldest) {
                            (Some(boundary), Some(oldest)) => oldest > boundary.as_str(),
                            _ => true,
                        }
                })
                .collect();
            if reading.is_empty() {
                let mut items: Vec<Item> = partitions.into_iter().flat_map(|partition| partition.items).collect();
                items.sort_by(|a, b| text(b, sort).unwrap_or_default().cmp(text(a, sort).unwrap_or_default()));
                items.truncate(count);
                return Ok(items);
            }
            page = (page * 2).min(1_000);
        }
    }

    /// Up to `count` items of `query` from `start_after` on, decoded: a
    /// Query answers at most 1 MB, so it goes on from where a page ended
    /// until it has them or there are no more.
    async fn query_up_to<T>(
        &self,
        query: QueryFluentBuilder,
        mut start_after: Option<Item>,
        count: usize,
        decode: impl Fn(Item) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut found = Vec::new();
        loop {
            let output = query
                .clone()
                .set_exclusive_start_key(start_after)
                .limit((count - found.len()) as i32)
                .send()
                .await
                .map_err(unavailable)?;
            for item in output.items.unwrap_or_default() {
                found.push(decode(item)?);
            }
            start_after = output.last_evaluated_key;
            if found.len() >= count || start_after.is_none() {
                return Ok(found);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> StoredEvent {
        StoredEvent { seq, kind: "output.appended".into(), at: Timestamp::from_millis(0), data: "{}".into() }
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
