//! The move of a table written before the sharded layout (runs, their
//! checkpoints, idempotency records and the active-run count under
//! `OWNER#<owner>`) to the current keys (docs/operations.md says when and
//! how to run it).

use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem};

use super::calls::TransactFailure;
use super::items::{
    RUN_SK, count_item, counter_shard, decode_run, defect, entry, idempotency_pk, run_items, text, unavailable,
};
use super::{CHECKPOINT_APART, COUNT_SK, DynamoStore, Item, LEGACY_COUNT, s};
use agent_runs_domain::{Clock, Owner, SystemClock};
use agent_runs_ports::store::StoreError;

/// What one pass of [`DynamoStore::migrate_layout`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    pub runs: usize,
    pub idempotency_records: usize,
    pub counters: usize,
    /// API keys from before owners' keys were listed, added to the list.
    pub keys: usize,
    /// Items that changed while being moved, left for another pass.
    pub skipped: usize,
}

/// An item of the old layout: its partition key is `OWNER#<owner>` itself
/// (the new list entries' keys go on with `#<shard>`).
fn legacy_owner(item: &Item) -> Option<Owner> {
    let owner = text(item, "pk").ok()?.strip_prefix("OWNER#")?;
    if owner.contains('#') {
        return None;
    }
    Owner::parse(owner).ok()
}

impl DynamoStore {
    /// Lists keys made before owners' keys were listed under their owner,
    /// then moves every item of the old layout to its new keys, each run in one
    /// transaction with its list entry and its checkpoint, each on its item
    /// of the active-run count under the stack's limit `max_active`. Then
    /// the count is counted anew from the runs not ended (rather than
    /// copied), which also turns the counts a later layout kept as numbers
    /// into their runs' ids; the old counts go last. Safe to run again: it
    /// moves only what is left, and a run that changed while being moved is
    /// skipped for the next pass. Meant for a stopped stack: a function of
    /// this version does not find an unmoved run.
    pub async fn migrate_layout(&self, max_active: u32) -> Result<Migrated, StoreError> {
        let mut migrated = Migrated { keys: self.list_unlisted_keys().await?, ..Migrated::default() };
        let mut counters = Vec::new();
        for (owner, item) in self.scan_legacy().await? {
            let sk = text(&item, "sk")?.to_owned();
            let moved = if sk.starts_with("RUN#") {
                let moved = self.migrate_run(item, max_active).await?;
                migrated.runs += usize::from(moved);
                moved
            } else if let Some(key_hash) = sk.strip_prefix("IDEM#") {
                let moved = self.migrate_idempotency_record(&owner, key_hash, item).await?;
                migrated.idempotency_records += usize::from(moved);
                moved
            } else {
                counters.push(owner);
                true
            };
            migrated.skipped += usize::from(!moved);
        }
        // Counts kept as numbers: one under `OWNER#<owner>`, or one on each
        // item of the count.
        let numbers = self
            .scan_filtered(
                &format!("begins_with(pk, :count) AND attribute_exists({LEGACY_COUNT})"),
                [(":count", s("ACTIVE#"))],
            )
            .await?;
        if migrated.skipped > 0 || (counters.is_empty() && numbers.is_empty()) {
            return Ok(migrated);
        }
        // Counted anew, once every run is moved: each run not ended takes
        // its place on the item it records; then the numbers go.
        let now = SystemClock.now();
        for item in self.scan_kind(RUN_SK).await? {
            let run = decode_run(item)?;
            if !run.status.is_terminal() {
                self.take_place(&run.owner, count_item(&run), u32::MAX, run.id, now).await?;
            }
        }
        for owner in counters {
            self.client
                .delete_item()
                .table_name(&self.table)
                .key("pk", s(format!("OWNER#{owner}")))
                .key("sk", s(COUNT_SK))
                .send()
                .await
                .map_err(unavailable)?;
            migrated.counters += 1;
        }
        for item in numbers {
            self.client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(text(&item, "pk")?))
                .key("sk", s(COUNT_SK))
                .update_expression(format!("REMOVE {LEGACY_COUNT}"))
                .send()
                .await
                .map_err(unavailable)?;
            migrated.counters += 1;
        }
        Ok(migrated)
    }

    /// The items of the old layout (their partition key is `OWNER#<owner>`)
    /// that are a run, an idempotency record or the count, with their owner.
    async fn scan_legacy(&self) -> Result<Vec<(Owner, Item)>, StoreError> {
        let filter = "begins_with(pk, :owner) AND (begins_with(sk, :run) OR begins_with(sk, :idem) OR sk = :active)";
        let values = [(":owner", s("OWNER#")), (":run", s("RUN#")), (":idem", s("IDEM#")), (":active", s("ACTIVE"))];
        let items = self.scan_filtered(filter, values).await?;
        Ok(items.into_iter().filter_map(|item| Some((legacy_owner(&item)?, item))).collect())
    }

    /// One run: `true` when moved, `false` when it changed meanwhile.
    async fn migrate_run(&self, item: Item, max_active: u32) -> Result<bool, StoreError> {
        let old_pk = text(&item, "pk")?.to_owned();
        let old_sk = text(&item, "sk")?.to_owned();
        let version = item.get("version").cloned().ok_or_else(|| defect("a stored run without a version"))?;
        let apart = item.contains_key(CHECKPOINT_APART);
        let mut run = decode_run(item)?;
        let old_checkpoint_sk = format!("CKPT#{}", run.id);
        if apart {
            let checkpoint = self.get_item(old_pk.clone(), old_checkpoint_sk.clone()).await?;
            let Some(checkpoint) = checkpoint else { return Ok(false) };
            let json = text(&checkpoint, "checkpoint")?;
            run.checkpoint = Some(serde_json::from_str(json).map_err(|_| defect("malformed stored checkpoint"))?);
        }
        run.store_note.count_item = Some(counter_shard(run.id, max_active));
        let (run_item, checkpoint_item) = run_items(&mut run)?;
        let put = |item: Item, condition: Option<&str>| -> Result<TransactWriteItem, StoreError> {
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(item))
                .set_condition_expression(condition.map(str::to_owned))
                .build()
                .map_err(defect)?;
            Ok(TransactWriteItem::builder().put(put).build())
        };
        let delete = |sk: String, version: Option<&aws_sdk_dynamodb::types::AttributeValue>| {
            let mut delete = Delete::builder().table_name(&self.table).key("pk", s(&old_pk)).key("sk", s(sk));
            if let Some(version) = version {
                delete = delete
                    .condition_expression("version = :version")
                    .expression_attribute_values(":version", version.clone());
            }
            delete.build().map(|delete| TransactWriteItem::builder().delete(delete).build()).map_err(defect)
        };
        let mut items = vec![
            put(run_item, Some("attribute_not_exists(pk)"))?,
            put(entry(&run.owner, run.id), None)?,
            delete(old_sk, Some(&version))?,
            delete(old_checkpoint_sk, None)?,
        ];
        if let Some(checkpoint) = checkpoint_item {
            items.push(put(checkpoint, None)?);
        }
        match self.transact(items).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::ConditionsFailed(_)) => Ok(false),
            Err(TransactFailure::Store(error) | TransactFailure::Refused(error)) => Err(error),
        }
    }

    async fn migrate_idempotency_record(
        &self,
        owner: &Owner,
        key_hash: &str,
        mut item: Item,
    ) -> Result<bool, StoreError> {
        let old_key = [("pk", item.remove("pk")), ("sk", item.remove("sk"))];
        item.insert("pk".into(), s(idempotency_pk(owner, key_hash)));
        item.insert("sk".into(), s("IDEM"));
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(defect)?;
        let mut delete = Delete::builder().table_name(&self.table);
        for (name, value) in old_key {
            delete = delete.key(name, value.ok_or_else(|| defect("an item without its key"))?);
        }
        let delete = delete.build().map_err(defect)?;
        let items =
            vec![TransactWriteItem::builder().put(put).build(), TransactWriteItem::builder().delete(delete).build()];
        match self.transact(items).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::ConditionsFailed(_)) => Ok(false),
            Err(TransactFailure::Store(error) | TransactFailure::Refused(error)) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_of_the_old_layout_are_moved() {
        let item = |pk: &str| Item::from([("pk".into(), s(pk)), ("sk".into(), s("RUN#x"))]);
        assert_eq!(legacy_owner(&item("OWNER#acme")), Some(Owner::parse("acme").unwrap()));
        assert_eq!(legacy_owner(&item("OWNER#acme#7")), None, "a list entry of the new layout");
        assert_eq!(legacy_owner(&item("RUN#01")), None);
    }
}
