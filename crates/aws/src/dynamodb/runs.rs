//! One run at a time: create, read and change it.

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{Delete, TransactWriteItem};

use super::calls::{TransactFailure, resent};
use super::items::{
    CHECKPOINT_SK, RUN_SK, checkpoint_of_version, defect, entry, event_sk, idempotency_pk, not_written, owners_run,
    run_items, run_pk, run_sk, thread_pk, unavailable,
};
use super::{
    COUNTER_SHARDS, DynamoStore, Item, MAX_TRANSACTION_BYTES, MAX_TRANSACTION_ITEMS, UPDATE_CONDITION, n, s,
    update_values, write_bytes,
};
use agent_runs_domain::{Owner, RunId};
use agent_runs_ports::store::{BatchWriteError, IdempotencyClaim, InsertOutcome, Run, RunStore, StoreError};

#[async_trait]
impl RunStore for DynamoStore {
    async fn insert(
        &self,
        run: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
        max_active: u32,
    ) -> Result<InsertOutcome, StoreError> {
        // The place first: a run never exists uncounted (a crash before the
        // run is written leaves a place the recount gives back). Until the
        // run's transaction is sent, a failure surely wrote no run.
        let place =
            if max_active == 0 { None } else { self.take_a_place(run, max_active).await.map_err(not_written)? };
        let Some(item) = place else {
            // A replay of an idempotency key is answered as one all the same.
            if let Some(claim) = idempotency
                && let Some(record) = self.idempotency_record(&run.owner, claim).await.map_err(not_written)?
            {
                return Ok(InsertOutcome::IdempotencyKeyTaken(record));
            }
            return Ok(InsertOutcome::TooManyActiveRuns);
        };
        let mut written = run.clone();
        written.store_note.count_item = Some(item);
        let items = match self.create_items(&mut written, idempotency) {
            Ok(items) => items,
            Err(error) => {
                self.give_back_or_leave(&written).await;
                return Err(error);
            }
        };
        let failed = match self.transact(items).await {
            Ok(()) => {
                *run = written;
                return Ok(InsertOutcome::Inserted);
            }
            Err(TransactFailure::ConditionsFailed(failed)) => failed,
            Err(TransactFailure::Refused(error)) => {
                self.give_back_or_leave(&written).await;
                return Err(error);
            }
            // The run may have been written all the same (a timeout): its
            // place stays, for the run or, should it not exist, the recount.
            Err(TransactFailure::Store(error)) => return Err(error),
        };
        if failed.first() == Some(&true) && self.get_item(run_pk(run.id), RUN_SK.into()).await?.is_some() {
            // A fresh id is only ever taken by this very write: an earlier
            // send of it landed though its answer was lost (a timeout).
            *run = written;
            return Ok(InsertOutcome::Inserted);
        }
        self.give_back_or_leave(&written).await;
        if let (Some(claim), Some(true)) = (idempotency, failed.get(1)) {
            let record = self
                .idempotency_record(&run.owner, claim)
                .await?
                .ok_or_else(|| defect("idempotency record vanished"))?;
            return Ok(InsertOutcome::IdempotencyKeyTaken(record));
        }
        Err(defect(format!("a new run's id was already taken: {}", run.id)))
    }

    async fn undo_create(&self, run: &Run, idempotency_key_hash: Option<&str>) -> Result<bool, StoreError> {
        let delete_run = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(run_pk(run.id)))
            .key("sk", s(RUN_SK))
            .condition_expression("version = :inserted AND #status = :queued")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":inserted", n(0))
            .expression_attribute_values(":queued", s("queued"))
            .build()
            .map_err(defect)?;
        let delete_entry = Delete::builder()
            .table_name(&self.table)
            .set_key(Some(entry(&run.owner, run.id)))
            .build()
            .map_err(defect)?;
        let mut items = vec![
            TransactWriteItem::builder().delete(delete_run).build(),
            TransactWriteItem::builder().delete(delete_entry).build(),
        ];
        // A continuation's: the checkpoint it carried (if kept apart) and
        // its thread entry.
        if run.checkpoint.is_some() {
            items.push(self.delete(run_pk(run.id), CHECKPOINT_SK.into())?);
        }
        if let Some(thread) = run.thread {
            items.push(self.delete(thread_pk(&run.owner, thread.thread_id), run_sk(run.id))?);
        }
        if let Some(key_hash) = idempotency_key_hash {
            let delete_record = Delete::builder()
                .table_name(&self.table)
                .key("pk", s(idempotency_pk(&run.owner, key_hash)))
                .key("sk", s("IDEM"))
                .condition_expression("attribute_not_exists(pk) OR run_id = :run")
                .expression_attribute_values(":run", s(run.id.to_string()))
                .build()
                .map_err(defect)?;
            items.push(TransactWriteItem::builder().delete(delete_record).build());
        }
        // The events of an untouched run: its `run.created`.
        for seq in 1..=run.event_seq {
            let delete = Delete::builder()
                .table_name(&self.table)
                .key("pk", s(run_pk(run.id)))
                .key("sk", s(event_sk(seq)))
                .build()
                .map_err(defect)?;
            items.push(TransactWriteItem::builder().delete(delete).build());
        }
        match self.transact(items).await {
            Ok(()) => {
                self.give_back_or_leave(run).await;
                Ok(true)
            }
            // The run moved on (or is gone): nothing may be undone.
            Err(TransactFailure::ConditionsFailed(_)) => Ok(false),
            Err(TransactFailure::Store(error) | TransactFailure::Refused(error)) => Err(error),
        }
    }

    async fn get(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        // A checkpoint kept apart is read second (an ended run's not at
        // all); should a write land between the two reads, the versions
        // differ and both are read again.
        for _ in 0..8 {
            let item = self.get_item(run_pk(run_id), RUN_SK.into()).await?;
            let Some((mut run, apart)) = owners_run(item, owner)? else { return Ok(None) };
            let Some(version) = apart.filter(|_| !run.status.is_terminal()) else {
                return Ok(Some(run));
            };
            let checkpoint = self.get_item(run_pk(run_id), CHECKPOINT_SK.into()).await?;
            let Some(checkpoint) = checkpoint_of_version(checkpoint, &version)? else { continue };
            run.checkpoint = Some(checkpoint);
            return Ok(Some(run));
        }
        Err(unavailable(std::io::Error::other("the run kept changing while its checkpoint was read")))
    }

    async fn get_to_continue(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        // The run and its checkpoint item in one consistent read.
        let key = |sk: &str| Item::from([("pk".into(), s(run_pk(run_id))), ("sk".into(), s(sk))]);
        for _ in 0..8 {
            let items = self.batch_get(vec![key(RUN_SK), key(CHECKPOINT_SK)], None).await?;
            let (mut runs, mut checkpoints): (Vec<Item>, Vec<Item>) = items
                .into_iter()
                .partition(|item| item.get("sk").and_then(|sk| sk.as_s().ok()).is_some_and(|sk| sk == RUN_SK));
            let Some((mut run, apart)) = owners_run(runs.pop(), owner)? else { return Ok(None) };
            let Some(version) = apart else { return Ok(Some(run)) };
            let Some(checkpoint) = checkpoint_of_version(checkpoints.pop(), &version)? else { continue };
            run.checkpoint = Some(checkpoint);
            return Ok(Some(run));
        }
        Err(unavailable(std::io::Error::other("the run kept changing while its checkpoint was read")))
    }

    async fn update(&self, run: &mut Run) -> Result<(), StoreError> {
        let mut next = run.clone();
        next.version += 1;
        let events = next.take_events();
        let (run_item, checkpoint_item) = run_items(&mut next)?;
        if checkpoint_item.is_none() && !next.status.is_terminal() && events.is_empty() {
            let put = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(run_item))
                .condition_expression(UPDATE_CONDITION)
                .expression_attribute_names("#status", "status")
                .set_expression_attribute_values(Some(update_values(run.version)));
            // A write to an item that a transaction holds is refused; it is
            // sent again, as transactions are.
            let held = |error: &SdkError<PutItemError>| {
                matches!(error.as_service_error(), Some(PutItemError::TransactionConflictException(_)))
            };
            return match resent(|| put.clone().send(), held).await {
                Ok(_) => {
                    *run = next;
                    Ok(())
                }
                Err(error)
                    if matches!(error.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) =>
                {
                    Err(StoreError::Conflict)
                }
                Err(error) => Err(unavailable(error)),
            };
        }
        let mut events = events;
        let mut written = self.update_in_transaction(run, &mut next, &events).await;
        if let Err(TransactFailure::ConditionsFailed(failed)) = &written
            && failed.first() != Some(&true)
            && let Some(first) = events.first().map(|event| event.seq)
        {
            // Only an event's seq was taken: the run moved on (an emulator
            // may name the event's condition rather than the run's), or its
            // count fell behind its log (a build that knew no events wrote
            // the run back without it). Only in the second case, the run
            // still at the version read, are the events numbered after the
            // last stored one and sent once more (the run's condition still
            // decides).
            let stored_version = self
                .get_item(run_pk(run.id), RUN_SK.into())
                .await?
                .and_then(|item| item.get("version").and_then(|value| value.as_n().ok()).cloned());
            let unchanged = stored_version.is_some_and(|version| version == run.version.to_string());
            let last = if unchanged { self.last_event_seq(run.id).await? } else { 0 };
            if unchanged && last >= first {
                tracing::warn!(run_id = %run.id, count = run.event_seq, last, "a run's event count was behind its log; numbering on from the log");
                for (event, seq) in events.iter_mut().zip(last + 1..) {
                    event.seq = seq;
                }
                next.event_seq = last + events.len() as u64;
                written = self.update_in_transaction(run, &mut next, &events).await;
            }
        }
        if next.status.is_terminal() {
            match &written {
                Ok(()) => self.give_back_or_leave(&next).await,
                // This very write may have landed though its answer was lost
                // (and its resend then found its condition gone): a run that
                // ended, by any write, has no place to keep.
                Err(_) => self.give_back_if_ended(&next).await,
            }
        }
        match written {
            Ok(()) => {
                *run = next;
                Ok(())
            }
            Err(TransactFailure::ConditionsFailed(_)) => Err(StoreError::Conflict),
            Err(TransactFailure::Store(error) | TransactFailure::Refused(error)) => Err(error),
        }
    }

    async fn update_batch(&self, runs: &mut [Run]) -> Result<(), BatchWriteError> {
        // Each run's writes, then as many whole runs per transaction as fit.
        let mut writes = Vec::with_capacity(runs.len());
        for (index, run) in runs.iter().enumerate() {
            let mut next = run.clone();
            next.version += 1;
            let events = next.take_events();
            let items =
                self.update_items(run, &mut next, &events).map_err(|error| BatchWriteError { written: 0, error })?;
            writes.push((index, next, items));
        }
        let mut start = 0;
        while start < writes.len() {
            let (mut end, mut count, mut bytes) = (start, 0, 0);
            while end < writes.len() {
                let (more, more_bytes) = (writes[end].2.len(), write_bytes(&writes[end].2));
                let fits = count + more <= MAX_TRANSACTION_ITEMS && bytes + more_bytes <= MAX_TRANSACTION_BYTES;
                if end > start && !fits {
                    break;
                }
                (count, bytes) = (count + more, bytes + more_bytes);
                end += 1;
            }
            let failed = |error| BatchWriteError { written: start, error };
            if end - start == 1 {
                // One run alone: `update`, with its repair of an event count
                // that fell behind the log.
                self.update(&mut runs[start]).await.map_err(failed)?;
            } else {
                let items = writes[start..end].iter_mut().flat_map(|(_, _, items)| std::mem::take(items)).collect();
                match self.transact(items).await {
                    Ok(()) => {
                        let ended = writes[start..end].iter().filter(|(_, next, _)| next.status.is_terminal());
                        futures_util::future::join_all(ended.map(|(_, next, _)| self.give_back_or_leave(next))).await;
                        for (index, next, _) in &writes[start..end] {
                            runs[*index] = next.clone();
                        }
                    }
                    Err(failure) => {
                        // As in `update`: the write may have landed all the same.
                        let ended = writes[start..end].iter().filter(|(_, next, _)| next.status.is_terminal());
                        futures_util::future::join_all(ended.map(|(_, next, _)| self.give_back_if_ended(next))).await;
                        return Err(failed(match failure {
                            TransactFailure::ConditionsFailed(_) => StoreError::Conflict,
                            TransactFailure::Store(error) | TransactFailure::Refused(error) => error,
                        }));
                    }
                }
            }
            start = end;
        }
        Ok(())
    }
}

impl DynamoStore {
    /// How many of the owner's runs are counted as active (for tests and
    /// inspection: the service reads the count only in the create's write).
    pub async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError> {
        let items: Vec<u32> = (0..COUNTER_SHARDS).collect();
        Ok(self.active_on(owner, &items).await?.iter().sum())
    }
}
