//! Approval policies in the table: `POLICY#<owner>` / `POLICY`, the
//! document as JSON text beside its version. The history a policy is tried
//! on is an index: each `approval.decided` event of a tool call a person
//! decided also carries `gsi4` keys (`DEC#<owner>`, newest by when it was
//! decided) and the call (tool, arguments, decision), projected into the
//! index, so a replay reads one Query page per 1 MB and no run.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;

use super::items::{RUN_SK, decode_run, defect, number, run_pk, text, unavailable};
use super::{DECISIONS_INDEX, DynamoStore, Item, n, s};
use agent_runs_domain::{DecidedCall, HumanDecision, KeyId, Owner, Policy, Rule, RunId, Timestamp, canonical_json};
use agent_runs_ports::store::{PolicyStore, StoreError, decode_policy, encode_policy};

const POLICY_SK: &str = "POLICY";

fn policy_pk(owner: &Owner) -> String {
    format!("POLICY#{owner}")
}

/// The attributes that put a person's decision of `call` into the
/// history (on its `approval.decided` event item).
pub(super) fn decision_attributes(owner: &Owner, call: &DecidedCall) -> Item {
    let sort = format!("{:013}#{}#{}", call.resolved_at.millis().max(0), call.run_id, call.approval_id);
    Item::from([
        ("gsi4pk".into(), s(format!("DEC#{owner}"))),
        ("gsi4sk".into(), s(sort)),
        ("agent".into(), s(&call.agent)),
        ("call_tool".into(), s(&call.tool)),
        ("call_arguments".into(), s(canonical_json(&call.arguments))),
        ("decision".into(), s(call.human.as_str())),
    ])
}

fn decode_decision(item: Item) -> Result<DecidedCall, StoreError> {
    let sort = text(&item, "gsi4sk")?;
    let mut parts = sort.splitn(3, '#');
    let (Some(at), Some(run_id), Some(approval_id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(defect("a decision's index key is malformed"));
    };
    let malformed = || defect("a decision in the index is malformed");
    Ok(DecidedCall {
        run_id: run_id.parse::<RunId>().map_err(|_| malformed())?,
        approval_id: approval_id.parse().map_err(|_| malformed())?,
        agent: text(&item, "agent")?.to_owned(),
        tool: text(&item, "call_tool")?.to_owned(),
        arguments: serde_json::from_str(text(&item, "call_arguments")?).map_err(|_| malformed())?,
        human: HumanDecision::parse(text(&item, "decision")?).ok_or_else(malformed)?,
        resolved_at: Timestamp::from_millis(at.parse().map_err(|_| malformed())?),
    })
}

impl DynamoStore {
    /// Puts the tool calls people decided before the history had its index
    /// into it: their `approval.decided` event items get the index's keys
    /// and the call, as one written now has them. The number indexed. Safe
    /// while the stack runs and to run again: an item already in the index
    /// is left as it is. Scans the runs: an admin operation.
    pub async fn index_decisions(&self) -> Result<usize, StoreError> {
        let mut indexed = 0;
        for item in self.scan_kind(RUN_SK).await? {
            // A run this release cannot read is left as it is, not the pass.
            let run = match decode_run(item) {
                Ok(run) => run,
                Err(error) => {
                    tracing::warn!(error = %error, "index_decisions: a run was skipped");
                    continue;
                }
            };
            let decided: Vec<DecidedCall> =
                run.approvals.iter().filter_map(|approval| DecidedCall::of(run.id, &run.agent, approval)).collect();
            if decided.is_empty() {
                continue;
            }
            for event in self.unindexed_decisions(run.id).await? {
                // The event is the approval it decided (as stored or as
                // rendered by an earlier release): its `id` names it.
                let shown =
                    text(&event, "data").ok().and_then(|data| serde_json::from_str::<serde_json::Value>(data).ok());
                let id = shown.as_ref().and_then(|shown| shown.get("id")).and_then(serde_json::Value::as_str);
                let Some(call) = decided.iter().find(|call| Some(call.approval_id.to_string().as_str()) == id) else {
                    continue;
                };
                let attributes = decision_attributes(&run.owner, call);
                let mut update = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .key("pk", s(text(&event, "pk")?))
                    .key("sk", s(text(&event, "sk")?))
                    .condition_expression("attribute_exists(pk) AND attribute_not_exists(gsi4pk)");
                let mut assignments = Vec::new();
                for (index, (name, value)) in attributes.into_iter().enumerate() {
                    assignments.push(format!("#a{index} = :a{index}"));
                    update = update
                        .expression_attribute_names(format!("#a{index}"), name)
                        .expression_attribute_values(format!(":a{index}"), value);
                }
                match update.update_expression(format!("SET {}", assignments.join(", "))).send().await {
                    Ok(_) => indexed += 1,
                    Err(error)
                        if matches!(
                            error.as_service_error(),
                            Some(UpdateItemError::ConditionalCheckFailedException(_))
                        ) => {}
                    Err(error) => return Err(unavailable(error)),
                }
            }
        }
        Ok(indexed)
    }

    /// The run's `approval.decided` event items not in the history's index.
    async fn unindexed_decisions(&self, run_id: RunId) -> Result<Vec<Item>, StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :events)")
            .filter_expression("#type = :decided AND attribute_not_exists(gsi4pk)")
            .expression_attribute_names("#type", "type")
            .expression_attribute_values(":pk", s(run_pk(run_id)))
            .expression_attribute_values(":events", s("EV#"))
            .expression_attribute_values(":decided", s("approval.decided"))
            .consistent_read(true);
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let output = query.clone().set_exclusive_start_key(start).send().await.map_err(unavailable)?;
            items.extend(output.items.unwrap_or_default());
            start = output.last_evaluated_key;
            if start.is_none() {
                return Ok(items);
            }
        }
    }
}

#[async_trait]
impl PolicyStore for DynamoStore {
    /// The item is read whole either way (one read unit up to 4 KB); only
    /// the decode is spared.
    async fn read_policy(&self, owner: &Owner, known: Option<u64>) -> Result<Option<Policy>, StoreError> {
        let Some(item) = self.get_item(policy_pk(owner), POLICY_SK.into()).await? else {
            return Ok((known != Some(0)).then(Policy::default));
        };
        let version = number(&item, "version")?;
        if Some(version) == known {
            return Ok(None);
        }
        decode_policy(version, text(&item, "document")?).map(Some)
    }

    async fn put_policy(
        &self,
        owner: &Owner,
        expected: Option<u64>,
        rules: &[Rule],
        at: Timestamp,
        by: KeyId,
    ) -> Result<Option<Policy>, StoreError> {
        let document = encode_policy(rules, at, by);
        // One version on, in the write itself: an unconditional put never
        // races another.
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(policy_pk(owner)))
            .key("sk", s(POLICY_SK))
            .update_expression("SET version = if_not_exists(version, :zero) + :one, document = :document")
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":document", s(&document))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew);
        let update = match expected {
            None => update,
            Some(0) => update.condition_expression("attribute_not_exists(pk)"),
            Some(version) => {
                update.condition_expression("version = :expected").expression_attribute_values(":expected", n(version))
            }
        };
        match update.send().await {
            Ok(output) => {
                let version = output.attributes.as_ref().map(|item| number(item, "version")).transpose()?;
                let version = version.ok_or_else(|| defect("a policy put came back without its version"))?;
                decode_policy(version, &document).map(Some)
            }
            Err(error)
                if matches!(error.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) =>
            {
                Ok(None)
            }
            Err(error) => Err(unavailable(error)),
        }
    }

    async fn decided_calls(&self, owner: &Owner, limit: usize) -> Result<Vec<DecidedCall>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DECISIONS_INDEX)
            .key_condition_expression("gsi4pk = :pk")
            .expression_attribute_values(":pk", s(format!("DEC#{owner}")))
            .scan_index_forward(false);
        self.query_up_to(query, None, limit, decode_decision).await
    }
}
