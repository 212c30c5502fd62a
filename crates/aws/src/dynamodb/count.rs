//! The active-run count: an owner's places spread over count items
//! (`ACTIVE#<owner>#<n>`), taken at create, given back at a run's end, and
//! recounted by the sweeper (docs/design.md, "A busy tenant on DynamoDB").

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, Update};

use super::items::{
    RUN_SK, count_item, count_sample, counted_runs, counter_cap, counter_pk, counter_shard, defect, recount_pk, run_pk,
    text, unavailable,
};
use super::{
    ABANDONED_CREATE, COUNT_SK, COUNTED_RUNS, COUNTER_RETRIES, DynamoStore, Item, LEGACY_COUNT, RECOUNT_EVERY,
    STATUS_ONLY, TERMINAL, n, s,
};
use agent_runs_domain::{Owner, RunId, Timestamp};
use agent_runs_ports::store::{Run, StoreError};

impl DynamoStore {
    /// Takes a place on item `item` of the owner's count for `run_id`, if
    /// the item counts fewer than `cap` runs (or this one already: a resend).
    /// `false` when it is full. The item's first place sets its recount.
    pub(super) async fn take_place(
        &self,
        owner: &Owner,
        item: u32,
        cap: u32,
        run_id: RunId,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        if cap == 0 {
            return Ok(false);
        }
        let taken = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(counter_pk(owner, item)))
            .key("sk", s(COUNT_SK))
            .update_expression(
                "ADD #runs :run SET gsi2pk = if_not_exists(gsi2pk, :recount), gsi2sk = if_not_exists(gsi2sk, :at)",
            )
            .condition_expression("attribute_not_exists(#runs) OR size(#runs) < :cap OR contains(#runs, :id)")
            .expression_attribute_names("#runs", COUNTED_RUNS)
            .expression_attribute_values(":run", AttributeValue::Ss(vec![run_id.to_string()]))
            .expression_attribute_values(":id", s(run_id.to_string()))
            .expression_attribute_values(":cap", n(cap))
            .expression_attribute_values(":recount", s(recount_pk(item)))
            .expression_attribute_values(":at", s(now.plus(RECOUNT_EVERY).to_rfc3339()))
            .send()
            .await;
        match taken {
            Ok(_) => Ok(true),
            Err(error)
                if matches!(error.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) =>
            {
                Ok(false)
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// A place on the owner's count for a new run: on the run's own item,
    /// else on up to [`COUNTER_RETRIES`] others with room among
    /// [`COUNTER_SAMPLE`] read at random, tried in random order. `None` when
    /// none has room.
    pub(super) async fn take_a_place(&self, run: &Run, limit: u32) -> Result<Option<u32>, StoreError> {
        let own = counter_shard(run.id, limit);
        if self.take_place(&run.owner, own, counter_cap(limit, own), run.id, run.created_at).await? {
            return Ok(Some(own));
        }
        let sample = count_sample(own, limit);
        let counts = self.active_on(&run.owner, &sample).await?;
        let with_room =
            sample.into_iter().zip(counts).filter(|(item, count)| *count < i64::from(counter_cap(limit, *item)));
        for (item, _) in with_room.take(COUNTER_RETRIES) {
            if self.take_place(&run.owner, item, counter_cap(limit, item), run.id, run.created_at).await? {
                return Ok(Some(item));
            }
        }
        Ok(None)
    }

    /// Gives back the place `run` took on its owner's count. Safe to repeat.
    pub(super) async fn give_back_place(&self, run: &Run) -> Result<(), StoreError> {
        let given_back = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(counter_pk(&run.owner, count_item(run))))
            .key("sk", s(COUNT_SK))
            .update_expression("DELETE #runs :run")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_names("#runs", COUNTED_RUNS)
            .expression_attribute_values(":run", AttributeValue::Ss(vec![run.id.to_string()]))
            .send()
            .await;
        match given_back {
            Ok(_) => Ok(()),
            Err(error)
                if matches!(error.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) =>
            {
                Ok(())
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    /// [`Self::give_back_place`] after the run's last write: on failure the
    /// place is left to the recount, as a crash would leave it.
    pub(super) async fn give_back_or_leave(&self, run: &Run) {
        if let Err(error) = self.give_back_place(run).await {
            tracing::warn!(run_id = %run.id, error = %agent_runs_ports::error_chain(&error), "a run's place on its owner's count is left to the recount");
        }
    }

    /// [`Self::give_back_or_leave`] if the stored run ended, by whatever
    /// write: after a terminal write whose outcome is not known.
    pub(super) async fn give_back_if_ended(&self, run: &Run) {
        let stored = self.get_item(run_pk(run.id), RUN_SK.into()).await;
        let status = stored.ok().flatten().and_then(|item| text(&item, "status").ok().map(str::to_owned));
        if status.is_some_and(|status| TERMINAL.contains(&status.as_str())) {
            self.give_back_or_leave(run).await;
        }
    }

    /// The owner's active runs on each of these items of the count.
    pub(super) async fn active_on(&self, owner: &Owner, items: &[u32]) -> Result<Vec<i64>, StoreError> {
        let keys = items
            .iter()
            .map(|item| Item::from([("pk".into(), s(counter_pk(owner, *item))), ("sk".into(), s(COUNT_SK))]))
            .collect();
        let mut counted = HashMap::with_capacity(items.len());
        for item in self.batch_get(keys, None).await? {
            counted.insert(text(&item, "pk")?.to_owned(), counted_runs(&item).len() as i64);
        }
        Ok(items.iter().map(|item| counted.get(&counter_pk(owner, *item)).copied().unwrap_or(0)).collect())
    }

    /// Checks one item of a count against its runs: gives back the places
    /// of runs that ended and of creates that never wrote their run, and
    /// sets the next recount (or deletes the item once it counts nothing).
    /// How many places were given back.
    pub(super) async fn recount(&self, key: Item, now: Timestamp) -> Result<usize, StoreError> {
        let Some(item) = self.get_item(text(&key, "pk")?.to_owned(), COUNT_SK.into()).await? else {
            return Ok(0);
        };
        let counted = counted_runs(&item);
        let ids: Vec<RunId> = counted.iter().filter_map(|id| id.parse().ok()).collect();
        let keys = ids.iter().map(|id| Item::from([("pk".into(), s(run_pk(*id))), ("sk".into(), s(RUN_SK))]));
        let mut statuses = HashMap::with_capacity(ids.len());
        for run in self.batch_get(keys.collect(), Some(STATUS_ONLY)).await? {
            statuses.insert(text(&run, "pk")?.to_owned(), text(&run, "status")?.to_owned());
        }
        let abandoned = now.millis().saturating_sub(ABANDONED_CREATE.as_millis() as i64);
        let stale: Vec<String> = counted
            .iter()
            .filter(|id| match id.parse::<RunId>() {
                Ok(run_id) => match statuses.get(&run_pk(run_id)) {
                    Some(status) => TERMINAL.contains(&status.as_str()),
                    None => (run_id.ulid().timestamp_ms() as i64) < abandoned,
                },
                // Not a run's id: nothing can ever give it back.
                Err(_) => true,
            })
            .cloned()
            .collect();
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key.clone()))
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":at", s(now.plus(RECOUNT_EVERY).to_rfc3339()))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew);
        update = if stale.is_empty() {
            update.update_expression("SET gsi2sk = :at")
        } else {
            update
                .update_expression("SET gsi2sk = :at DELETE #runs :stale")
                .expression_attribute_names("#runs", COUNTED_RUNS)
                .expression_attribute_values(":stale", AttributeValue::Ss(stale.clone()))
        };
        let updated = match update.send().await {
            Ok(output) => output.attributes.unwrap_or_default(),
            Err(error)
                if matches!(error.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) =>
            {
                return Ok(0);
            }
            Err(error) => return Err(unavailable(error)),
        };
        if counted_runs(&updated).is_empty() && !updated.contains_key(LEGACY_COUNT) {
            // Unless a create took a place meanwhile. A count kept as a
            // number stays for the migration, which counts its runs anew.
            let deleted = self
                .client
                .delete_item()
                .table_name(&self.table)
                .set_key(Some(key))
                .condition_expression("attribute_not_exists(#runs) AND attribute_not_exists(#legacy)")
                .expression_attribute_names("#runs", COUNTED_RUNS)
                .expression_attribute_names("#legacy", LEGACY_COUNT)
                .send()
                .await;
            if let Err(error) = deleted
                && !matches!(error.as_service_error(), Some(DeleteItemError::ConditionalCheckFailedException(_)))
            {
                return Err(unavailable(error));
            }
        }
        Ok(stale.len())
    }

    /// Adds `delta` to the number `attribute` of the item `key`, on the
    /// condition, with a `max`, that it is below it (a missing one is 0).
    pub(super) fn counter(
        &self,
        (pk, sk): (String, &str),
        attribute: &str,
        delta: i64,
        max: Option<u64>,
    ) -> Result<Update, StoreError> {
        let mut update = Update::builder()
            .table_name(&self.table)
            .key("pk", s(pk))
            .key("sk", s(sk))
            .update_expression(format!("ADD {attribute} :delta"))
            .expression_attribute_values(":delta", n(delta));
        if let Some(max) = max {
            update = update
                .condition_expression(format!("attribute_not_exists({attribute}) OR {attribute} < :max"))
                .expression_attribute_values(":max", n(max));
        }
        update.build().map_err(defect)
    }
}
