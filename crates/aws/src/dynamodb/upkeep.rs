//! The sweeper's reads and repairs.

use async_trait::async_trait;
use rand::Rng;

use super::items::{decode_due, due_sk, recount_pk, text, unavailable};
use super::{COUNT_SK, DUE_INDEX, DUE_SHARDS, DynamoStore, Item, RECOUNTS_AT_ONCE, s};
use agent_runs_domain::Timestamp;
use agent_runs_ports::store::{DueRun, Settled, StoreError, Upkeep};

#[async_trait]
impl Upkeep for DynamoStore {
    async fn due(&self, until: Timestamp, after: Option<&DueRun>, limit: u32) -> Result<Vec<DueRun>, StoreError> {
        // Every key sorts above the one after which we resume, and at or
        // below "until" followed by any run id.
        let low = after.map_or_else(
            || "0".to_owned(),
            |due| format!("{}\u{1}", due_sk(due.due_at, due.key.run_id, &due.key.owner)),
        );
        let high = format!("{}#~", until.to_rfc3339());
        let mut merged = Vec::new();
        for shard in 0..DUE_SHARDS {
            // Up to `limit` from each shard; a Query that stops at 1 MB goes on.
            let mut from_shard = 0;
            let mut start = None;
            loop {
                let output = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(DUE_INDEX)
                    .key_condition_expression("gsi2pk = :shard AND gsi2sk BETWEEN :low AND :high")
                    .expression_attribute_values(":shard", s(format!("DUE#{shard}")))
                    .expression_attribute_values(":low", s(&low))
                    .expression_attribute_values(":high", s(&high))
                    .set_exclusive_start_key(start)
                    .limit((limit as usize - from_shard) as i32)
                    .send()
                    .await
                    .map_err(unavailable)?;
                // A malformed entry is left out and does not count, so the
                // page still holds `limit` runs when there are that many.
                for item in output.items.unwrap_or_default() {
                    match decode_due(&item) {
                        Ok(due) => {
                            merged.push(due);
                            from_shard += 1;
                        }
                        Err(error) => {
                            tracing::error!(error = %error, "a due index entry is malformed; the sweeper leaves it out")
                        }
                    }
                }
                start = output.last_evaluated_key;
                if from_shard >= limit as usize || start.is_none() {
                    break;
                }
            }
        }
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(merged.into_iter().take(limit as usize).map(|(_, due)| due).collect())
    }

    async fn settle_counts(&self, now: Timestamp, deadline: Option<std::time::Instant>) -> Result<Settled, StoreError> {
        let mut settled = Settled::default();
        // From a shard picked at random, so that a pass cut short at its
        // deadline does not leave the same shards behind each time.
        let first = rand::rng().random_range(0..DUE_SHARDS);
        for shard in (0..DUE_SHARDS).map(|at| (first + at) % DUE_SHARDS) {
            let query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(DUE_INDEX)
                .key_condition_expression("gsi2pk = :recount AND gsi2sk <= :now")
                .expression_attribute_values(":recount", s(recount_pk(shard)))
                .expression_attribute_values(":now", s(now.to_rfc3339()));
            // Each item due is checked once: the index may still show it
            // due after its next recount is set.
            let mut start = None;
            loop {
                let output = query.clone().set_exclusive_start_key(start).send().await.map_err(unavailable)?;
                let mut keys = Vec::new();
                for entry in output.items.unwrap_or_default() {
                    keys.push(Item::from([("pk".into(), s(text(&entry, "pk")?)), ("sk".into(), s(COUNT_SK))]));
                }
                for keys in keys.chunks(RECOUNTS_AT_ONCE) {
                    if deadline.is_some_and(|deadline| std::time::Instant::now() >= deadline) {
                        settled.unfinished = true;
                        return Ok(settled);
                    }
                    let recounts = keys.iter().map(|key| self.recount(key.clone(), now));
                    for outcome in futures_util::future::join_all(recounts).await {
                        match outcome {
                            Ok(given_back) => {
                                settled.given_back += given_back;
                                settled.items += 1;
                            }
                            // It stays due: the next pass tries it again.
                            Err(error) => {
                                tracing::warn!(error = %agent_runs_ports::error_chain(&error), "an item of an active-run count could not be recounted")
                            }
                        }
                    }
                }
                start = output.last_evaluated_key;
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(settled)
    }
}
