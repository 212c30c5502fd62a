//! The keys of the items and their encoding: what each item of the table
//! holds, and how it reads back.

use aws_sdk_dynamodb::types::{Put, TransactWriteItem};

use super::{
    CHECKPOINT_APART, COUNTED_RUNS, COUNTER_SAMPLE, COUNTER_SHARDS, DUE_SHARDS, INLINE_CHECKPOINT_BYTES, Item,
    OWNER_SHARDS, RUNS_PER_COUNTER, n, s,
};
use agent_runs_domain::{
    ApprovalId, ApprovalStatus, DecidedCall, Event, EventData, Owner, RunId, RunStatus, Timestamp,
};
use agent_runs_ports::store::record::StoredRun;
use agent_runs_ports::store::{
    DueRun, EventBody, MAX_CHECKPOINT_BYTES, RENDERED_FORMAT, Run, RunKey, StoreError, StoredEvent,
};

/// The run's shard of its owner's keys.
pub(super) fn shard(run_id: RunId) -> u32 {
    (run_id.ulid().random() % u128::from(OWNER_SHARDS)) as u32
}

pub(super) const RUN_SK: &str = "RUN";
pub(super) const CHECKPOINT_SK: &str = "CKPT";

/// The partition of a run, its checkpoint and its events.
pub(super) fn run_pk(run_id: RunId) -> String {
    format!("RUN#{run_id}")
}

/// The key of the owner's list entry of a run, which is the whole entry.
pub(super) fn entry(owner: &Owner, run_id: RunId) -> Item {
    Item::from([("pk".into(), s(format!("OWNER#{owner}#{}", shard(run_id)))), ("sk".into(), s(run_sk(run_id)))])
}

/// The partition of the owner's entries of a thread's continuations (its
/// first run has none: it is read by its id).
pub(super) fn thread_pk(owner: &Owner, thread_id: RunId) -> String {
    format!("THREAD#{owner}#{thread_id}")
}

pub(super) fn run_sk(run_id: RunId) -> String {
    format!("RUN#{run_id}")
}

pub(super) fn status_pk(owner: &Owner, status: RunStatus, shard: u32) -> String {
    format!("OWNER#{owner}#STATUS#{}#{shard}", status.as_str())
}

pub(super) fn counter_pk(owner: &Owner, shard: u32) -> String {
    format!("ACTIVE#{owner}#{shard}")
}

pub(super) fn idempotency_pk(owner: &Owner, key_hash: &str) -> String {
    format!("IDEM#{owner}#{key_hash}")
}

/// How many items of the count `limit` active runs are split over: each
/// holds at least [`RUNS_PER_COUNTER`], up to [`COUNTER_SHARDS`] items.
pub(super) fn counter_shards(limit: u32) -> u32 {
    (limit / RUNS_PER_COUNTER).clamp(1, COUNTER_SHARDS)
}

/// The most of `limit` active runs item `shard` of the count holds: the
/// limit split evenly over [`counter_shards`], any remainder on the first.
pub(super) fn counter_cap(limit: u32, shard: u32) -> u32 {
    let shards = counter_shards(limit);
    if shard >= shards {
        return 0;
    }
    limit / shards + u32::from(shard < limit % shards)
}

/// The run's own item of the count, under `limit`: the one its create tries
/// first and its end gives back to.
pub(super) fn counter_shard(run_id: RunId, limit: u32) -> u32 {
    (run_id.ulid().random() % u128::from(counter_shards(limit))) as u32
}

/// The items a create whose own item `own` found full reads: up to
/// [`COUNTER_SAMPLE`] others of those in use under `limit`, at random.
pub(super) fn count_sample(own: u32, limit: u32) -> Vec<u32> {
    let mut sample: Vec<u32> = (0..counter_shards(limit)).filter(|item| *item != own).collect();
    rand::seq::SliceRandom::shuffle(sample.as_mut_slice(), &mut rand::rng());
    sample.truncate(COUNTER_SAMPLE);
    sample
}

/// The item of the count that `run`'s create took (runs from before items
/// were recorded: their own item under the default limit).
pub(super) fn count_item(run: &Run) -> u32 {
    run.store_note.count_item.unwrap_or_else(|| counter_shard(run.id, agent_runs_ports::store::DEFAULT_MAX_ACTIVE_RUNS))
}

/// The ids an item of the count holds.
pub(super) fn counted_runs(item: &Item) -> Vec<String> {
    item.get(COUNTED_RUNS).and_then(|runs| runs.as_ss().ok()).cloned().unwrap_or_default()
}

/// The due index partition where item `item` of any owner's count waits
/// for its recount.
pub(super) fn recount_pk(item: u32) -> String {
    format!("RECOUNT#{}", item % DUE_SHARDS)
}

pub(super) fn due_sk(due_at: Timestamp, run_id: RunId, owner: &Owner) -> String {
    format!("{}#{run_id}#{owner}", due_at.to_rfc3339())
}

pub(super) fn due_shard(run_id: RunId) -> u32 {
    ((run_id.ulid().random() >> 16) % u128::from(DUE_SHARDS)) as u32
}

pub(super) fn unavailable<E: std::error::Error + Send + Sync + 'static>(error: E) -> StoreError {
    StoreError::Unavailable(Box::new(error))
}

/// `error`, of a call made before a write was sent: the write surely did
/// not happen.
pub(super) fn not_written(error: StoreError) -> StoreError {
    match error {
        StoreError::Unavailable(source) => StoreError::Refused(source),
        other => other,
    }
}

pub(super) fn defect(what: impl std::fmt::Display) -> StoreError {
    StoreError::Defect(what.to_string())
}

pub(super) fn event_sk(seq: u64) -> String {
    format!("EV#{seq:012}")
}

/// The inbox index's sort key: `<requested_at, 13 digits>#<run_id>`, and
/// `#<approval_id>` for one approval's entry (or a cursor's position).
pub(super) fn inbox_sort_key(requested_at: Timestamp, run_id: RunId, approval: Option<ApprovalId>) -> String {
    let key = format!("{:013}#{run_id}", requested_at.millis().max(0));
    match approval {
        Some(approval) => format!("{key}#{approval}"),
        None => key,
    }
}

/// The inbox index keys of `run`'s approvals with `status` (the sort key
/// of one approval, or of all of the run's pending ones when `None`).
pub(super) fn inbox_keys(
    run: &Run,
    status: ApprovalStatus,
    requested_at: Timestamp,
    approval: Option<ApprovalId>,
) -> Item {
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
pub(super) fn event_put(
    table: &str,
    run: &Run,
    event: &Event,
    data: EventBody,
) -> Result<TransactWriteItem, StoreError> {
    let inbox = match &event.data {
        EventData::ApprovalDecided(approval)
        | EventData::ApprovalExpired(approval)
        | EventData::ApprovalCanceled(approval) => {
            let mut keys = inbox_keys(run, approval.status, approval.requested_at, Some(approval.id));
            // A person's decision of a call is history a policy is tried on.
            if let Some(decided) = DecidedCall::of(run.id, &run.agent, approval) {
                keys.extend(super::policies::decision_attributes(&run.owner, &decided));
            }
            Some(keys)
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
        .item("data", s(data.text()))
        .item("fmt", n(data.format()))
        // Whose it is, for the webhook notifier reading the table's stream.
        .item("owner", s(run.owner.as_str()))
        // A seq is never written twice; should the run's count be wrong,
        // the write fails rather than overwrite the log.
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .map_err(defect)?;
    Ok(TransactWriteItem::builder().put(put).build())
}

/// The item's number attribute `name`, as `T`.
pub(super) fn number<T: std::str::FromStr>(item: &Item, name: &str) -> Result<T, StoreError> {
    item.get(name)
        .and_then(|value| value.as_n().ok())
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| defect(format!("an item without a numeric {name}")))
}

pub(super) fn decode_event_item(item: &Item) -> Result<StoredEvent, StoreError> {
    let number = |name: &str| number::<i64>(item, name);
    // Events written before the stored record have no format; one this
    // release does not know fails where the event is shown.
    let format = match item.contains_key("fmt") {
        true => u8::try_from(number("fmt")?).unwrap_or(u8::MAX),
        false => RENDERED_FORMAT,
    };
    Ok(StoredEvent {
        seq: number("seq")? as u64,
        kind: text(item, "type")?.to_owned(),
        at: Timestamp::from_millis(number("at")?),
        data: EventBody::stored(format, text(item, "data")?.to_owned()),
    })
}

/// How many of `events` follow on from `after` without a gap.
pub(super) fn following_on(after: u64, events: &[StoredEvent]) -> usize {
    events.iter().zip(after + 1..).take_while(|(event, seq)| event.seq == *seq).count()
}

/// The run's item and, when its checkpoint is too large to keep inline or
/// the run ended (gets and lists of ended runs never pay for what it ended
/// with), the checkpoint's own item; the run then notes that it has one.
pub(super) fn run_items(run: &mut Run) -> Result<(Item, Option<Item>), StoreError> {
    let ended = run.status.is_terminal();
    let apart = match &run.checkpoint {
        Some(checkpoint) => {
            let json = serde_json::to_string(checkpoint).map_err(defect)?;
            match json.len() {
                // What an ended run ended with is kept only when it fits:
                // its end is never refused for it.
                size if size > MAX_CHECKPOINT_BYTES && ended => {
                    tracing::warn!(run_id = %run.id, size, "the state a run ended with is too large to keep");
                    None
                }
                size if size > MAX_CHECKPOINT_BYTES => {
                    return Err(defect(format!("a checkpoint of {size} bytes is over the limit")));
                }
                size => (size > INLINE_CHECKPOINT_BYTES || ended).then_some(json),
            }
        }
        None => None,
    };
    run.store_note.checkpoint_item = match apart {
        // Needed only until the end, which deletes or replaces that item.
        _ if ended => None,
        Some(_) => Some(true),
        None => run.store_note.checkpoint_item,
    };
    let mut item = run_item(run)?;
    let Some(json) = apart else {
        if ended {
            item.remove("checkpoint");
        }
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

/// The run of a run item, if it is `owner`'s, with the version of its
/// checkpoint kept apart (if one is).
pub(super) fn owners_run(item: Option<Item>, owner: &Owner) -> Result<Option<(Run, Option<String>)>, StoreError> {
    let Some(item) = item else { return Ok(None) };
    let apart = item.get(CHECKPOINT_APART).and_then(|value| value.as_n().ok()).cloned();
    let run = decode_run(item)?;
    Ok((run.owner == *owner).then_some((run, apart)))
}

/// The checkpoint a checkpoint item holds, if it is the one of `version`
/// (a write may have landed between reading the run and reading it).
pub(super) fn checkpoint_of_version(
    item: Option<Item>,
    version: &str,
) -> Result<Option<serde_json::Value>, StoreError> {
    let Some(item) = item.filter(|item| item.get("version").and_then(|v| v.as_n().ok()).is_some_and(|v| v == version))
    else {
        return Ok(None);
    };
    let json = text(&item, "checkpoint")?;
    serde_json::from_str(json).map(Some).map_err(|_| defect("malformed stored checkpoint"))
}

pub(super) fn run_item(run: &Run) -> Result<Item, StoreError> {
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

pub(super) fn decode_run(mut item: Item) -> Result<Run, StoreError> {
    for key in ["pk", "sk", "gsi1pk", "gsi1sk", "gsi2pk", "gsi2sk", "gsi3pk", "gsi3sk", CHECKPOINT_APART] {
        item.remove(key);
    }
    serde_dynamo::from_item::<_, StoredRun>(item)
        .map_err(|error| defect(format!("cannot decode stored run: {error}")))?
        .try_into()
}

/// A due index entry and its sort key, by which entries are merged.
pub(super) fn decode_due(item: &Item) -> Result<(String, DueRun), StoreError> {
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
pub(super) struct InboxIndexEntry {
    pub(super) requested_at: i64,
    pub(super) run_id: RunId,
    /// The approval, when the entry is one approval's; `None` for a run
    /// awaiting approval, whose entry is its pending ones requested then.
    pub(super) approval: Option<ApprovalId>,
}

pub(super) fn decode_inbox_entry(item: &Item) -> Result<InboxIndexEntry, StoreError> {
    let mut parts = text(item, "gsi3sk")?.split('#');
    let requested_at = parts.next().and_then(|at| at.parse().ok()).ok_or_else(|| defect("malformed inbox time"))?;
    let run_id = parts.next().and_then(|id| id.parse().ok()).ok_or_else(|| defect("malformed inbox run id"))?;
    let approval = parts.next().map(|id| id.parse().map_err(|_| defect("malformed inbox approval id"))).transpose()?;
    Ok(InboxIndexEntry { requested_at, run_id, approval })
}

pub(super) fn text<'a>(item: &'a Item, name: &str) -> Result<&'a str, StoreError> {
    item.get(name)
        .and_then(|value| value.as_s().ok())
        .map(String::as_str)
        .ok_or_else(|| defect(format!("item without {name}")))
}
