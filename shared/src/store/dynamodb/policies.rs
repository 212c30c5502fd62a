//! Approval policies in the table: `POLICY#<owner>` / `POLICY`, the
//! document as JSON text beside its version. The history a policy is tried
//! on is an index: each `approval.decided` event of a tool call a person
//! decided also carries `gsi4` keys (`DEC#<owner>`, newest by when it was
//! decided) and the call (tool, arguments, decision), projected into the
//! index, so a replay reads one Query page per 1 MB and no run.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;

use super::{DECISIONS_INDEX, DynamoStore, Item, defect, n, number, s, text, unavailable};
use crate::domain::{DecidedCall, HumanDecision, KeyId, Owner, Policy, Rule, RunId, Timestamp, canonical_json};
use crate::store::{PolicyStore, StoreError, decode_policy, encode_policy};

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

#[async_trait]
impl PolicyStore for DynamoStore {
    async fn policy(&self, owner: &Owner) -> Result<Policy, StoreError> {
        let Some(item) = self.get_item(policy_pk(owner), POLICY_SK.into()).await? else {
            return Ok(Policy::default());
        };
        let version = number(&item, "version")?;
        decode_policy(version, text(&item, "document")?)
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
