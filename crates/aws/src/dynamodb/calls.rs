//! The table calls the ports share: reads, batch reads, Queries across
//! shards, and transactions sent again while DynamoDB turns them away.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem};
use rand::Rng;

use super::items::{
    CHECKPOINT_SK, RUN_SK, decode_event_item, decode_run, defect, entry, event_put, idempotency_pk, run_items, run_pk,
    run_sk, text, thread_pk, unavailable,
};
use super::{
    DynamoStore, Item, KIND_FILTERED_BUDGET, Projection, TRANSACT_ATTEMPTS, TRANSACT_BACKOFF_BASE,
    TRANSACT_BACKOFF_CAP, UPDATE_CONDITION, n, s, update_values,
};
use agent_runs_domain::{Event, Owner, RunId};
use agent_runs_ports::store::{EventBody, EventFormat, IdempotencyClaim, IdempotencyRecord, Run, StoreError};
use agent_runs_ports::views::ExtraFields;

/// Why DynamoDB canceled a transaction, from its reasons (one per item, in
/// order; `None` for an item that was fine).
pub(super) enum Cancellation {
    /// These items' conditions were false (`true` at their positions).
    ConditionsFailed(Vec<bool>),
    /// Another transaction held an item, or the table was throttled: nothing
    /// was written, and the same transaction may be sent again.
    Retryable,
}

pub(super) fn cancellation(error: &SdkError<TransactWriteItemsError>) -> Option<Cancellation> {
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
pub(super) enum TransactFailure {
    /// These items' conditions were false (`true` at their positions).
    ConditionsFailed(Vec<bool>),
    /// Canceled for conflicts or throttling each time it was sent: nothing
    /// was written.
    Refused(StoreError),
    /// It may or may not have been written (a timeout, an outage).
    Store(StoreError),
}

/// A random wait of up to `base * 2^(attempt - 1)`, capped ("full jitter").
pub(super) fn transact_backoff(attempt: u32) -> Duration {
    let ceiling = TRANSACT_BACKOFF_BASE.saturating_mul(1 << (attempt - 1).min(16)).min(TRANSACT_BACKOFF_CAP);
    ceiling.mul_f64(rand::rng().random::<f64>())
}

/// `send`'s outcome, sent again (with [`transact_backoff`], up to
/// [`TRANSACT_ATTEMPTS`] sends) while its error is one that `wrote_nothing`
/// says left no effect: a conflict with a transaction, or throttling.
pub(super) async fn resent<T, E, F>(mut send: impl FnMut() -> F, wrote_nothing: impl Fn(&E) -> bool) -> Result<T, E>
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
        let (shown, event_format) = (ExtraFields::default(), EventFormat::default());
        Self { client, table: table.into(), shown, event_format, kind_filter_budget: KIND_FILTERED_BUDGET }
    }

    /// Reads at most `entries` inbox entries for a page with a kind filter
    /// (500 unless told; tests make it small to see a page stop short).
    pub fn reading_inbox_kinds(self, entries: usize) -> Self {
        DynamoStore { kind_filter_budget: entries.max(1), ..self }
    }

    /// Renders runs in lists and events showing `shown` (what the
    /// deployment's configuration says; nothing beyond the contract unless
    /// told).
    pub fn showing(self, shown: ExtraFields) -> Self {
        DynamoStore { shown, ..self }
    }

    /// Writes events in `format` (see [`EventFormat`]).
    pub fn writing_events(self, event_format: EventFormat) -> Self {
        DynamoStore { event_format, ..self }
    }

    pub(super) fn event_body(&self, event: &Event) -> EventBody {
        EventBody::written(&event.data, self.event_format, self.shown)
    }

    /// A read of an item that never exists (API key lookups use the same
    /// permission), to open the connection to DynamoDB.
    pub async fn warm_up(&self) {
        let _ =
            self.client.get_item().table_name(&self.table).key("pk", s("KEY#warm-up")).key("sk", s("KEY")).send().await;
    }

    pub(super) async fn get_item(&self, pk: String, sk: String) -> Result<Option<Item>, StoreError> {
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
    pub(super) async fn scan_kind(&self, sort_key: &str) -> Result<Vec<Item>, StoreError> {
        self.scan_filtered("sk = :kind", [(":kind", s(sort_key))]).await
    }

    /// Every item `filter` keeps, by a consistent Scan of the whole table:
    /// for admin operations only.
    pub(super) async fn scan_filtered<const N: usize>(
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
    pub(super) async fn update_in_transaction(
        &self,
        run: &Run,
        next: &mut Run,
        events: &[Event],
    ) -> Result<(), TransactFailure> {
        let items = self.update_items(run, next, events).map_err(TransactFailure::Store)?;
        self.transact(items).await
    }

    /// An unconditional put of one item, in a transaction.
    pub(super) fn put(&self, item: Item) -> Result<TransactWriteItem, StoreError> {
        let put = Put::builder().table_name(&self.table).set_item(Some(item)).build().map_err(defect)?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// An unconditional delete of one item, in a transaction.
    pub(super) fn delete(&self, pk: String, sk: String) -> Result<TransactWriteItem, StoreError> {
        let delete =
            Delete::builder().table_name(&self.table).key("pk", s(pk)).key("sk", s(sk)).build().map_err(defect)?;
        Ok(TransactWriteItem::builder().delete(delete).build())
    }

    pub(super) fn update_items(
        &self,
        run: &Run,
        next: &mut Run,
        events: &[Event],
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
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
        match checkpoint_item {
            Some(checkpoint) => items.push(self.put(checkpoint)?),
            // The run's checkpoint item, if it may have one (as stored
            // before this write; a run written by a release that kept no
            // note may), is no longer needed.
            None if next.status.is_terminal() && run.store_note.checkpoint_item != Some(false) => {
                items.push(self.delete(run_pk(run.id), CHECKPOINT_SK.into())?)
            }
            None => {}
        }
        for event in events {
            items.push(event_put(&self.table, next, event, self.event_body(event))?);
        }
        Ok(items)
    }

    /// The owner's runs of these ids that exist, read consistently (without
    /// a checkpoint kept apart).
    pub(super) async fn get_runs(
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
    pub(super) async fn batch_get(
        &self,
        keys: Vec<Item>,
        projection: Option<Projection>,
    ) -> Result<Vec<Item>, StoreError> {
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
    pub(super) async fn last_event_seq(&self, run_id: RunId) -> Result<u64, StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :events)")
            .expression_attribute_values(":pk", s(run_pk(run_id)))
            .expression_attribute_values(":events", s("EV#"))
            .scan_index_forward(false)
            .consistent_read(true);
        let last = self.query_up_to(query, None, 1, |item| decode_event_item(&item)).await?;
        Ok(last.first().map_or(0, |event| event.seq))
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// A new run's writes: the run, its idempotency record, its list entry
    /// and its events (taken from `written`).
    pub(super) fn create_items(
        &self,
        written: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        let events = written.take_events();
        // Noted from the start: the end of a run that never kept a
        // checkpoint apart has no item to delete.
        written.store_note.checkpoint_item.get_or_insert(false);
        let (run_item, checkpoint_item) = run_items(written)?;
        let put_run = Put::builder()
            .table_name(&self.table)
            .set_item(Some(run_item))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(defect)?;
        // The run first and its idempotency record second: `insert` reads
        // which conditions failed by position.
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
        items.push(self.put(entry(&written.owner, written.id))?);
        // A continuation's: what the run it continues ended with, when large.
        if let Some(checkpoint) = checkpoint_item {
            items.push(self.put(checkpoint)?);
        }
        if let Some(thread) = written.thread {
            let thread_entry = Item::from([
                ("pk".into(), s(thread_pk(&written.owner, thread.thread_id))),
                ("sk".into(), s(run_sk(written.id))),
            ]);
            items.push(self.put(thread_entry)?);
        }
        for event in &events {
            items.push(event_put(&self.table, written, event, self.event_body(event))?);
        }
        Ok(items)
    }

    /// The record of the claim's idempotency key, unless there is none or
    /// it expired by the claim's time.
    pub(super) async fn idempotency_record(
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
    pub(super) async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), TransactFailure> {
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
    pub(super) async fn newest_across(
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
    pub(super) async fn query_up_to<T>(
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
