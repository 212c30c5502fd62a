//! Approval policies and the history they are tried on, on every store.

use super::*;

/// A policy is replaced whole, only from the version the writer read; the
/// history holds exactly the tool calls people decided, newest first.
pub(super) async fn policies_are_replaced_whole_and_tried_on_what_people_decided(
    store: &dyn TestStore,
    policies: &dyn PolicyStore,
) {
    use agent_runs_domain::{HumanDecision, ProposedCall, Resolver, RuleDecision, parse_rules};
    let acme = owner("policies");
    assert_eq!(policies.policy(&acme).await.unwrap(), Default::default());
    let rules = |effect: &str| {
        parse_rules(&serde_json::json!({"rules": [{"id": "r", "tool": "delete_*", "effect": effect}]})).unwrap()
    };
    let key = KeyId::from_ulid(Ulid::from_parts(T0, 5));
    let at = Timestamp::from_millis(T0 as i64);
    let first = policies.put_policy(&acme, Some(0), &rules("deny"), at, key).await.unwrap().expect("the first put");
    assert_eq!((first.version, first.updated_by, first.updated_at), (1, Some(key), Some(at)));
    assert_eq!(policies.policy(&acme).await.unwrap(), first);
    // Another writer read version 0 too: its put changes nothing.
    assert_eq!(policies.put_policy(&acme, Some(0), &rules("allow"), at, key).await.unwrap(), None);
    assert_eq!(policies.put_policy(&acme, Some(5), &rules("allow"), at, key).await.unwrap(), None);
    assert_eq!(policies.put_policy(&acme, Some(u64::MAX), &rules("allow"), at, key).await.unwrap(), None);
    let second = policies.put_policy(&acme, Some(1), &rules("allow"), at, key).await.unwrap().unwrap();
    assert_eq!((second.version, second.rules[0].effect.as_str()), (2, "allow"));
    assert_eq!(policies.policy(&acme).await.unwrap(), second);
    // Without a version: one on from whatever is there, never refused.
    let third = policies.put_policy(&acme, None, &rules("ask"), at, key).await.unwrap().unwrap();
    assert_eq!((third.version, third.rules[0].effect.as_str()), (3, "ask"));
    let fresh = policies.put_policy(&owner("policies-new"), None, &rules("ask"), at, key).await.unwrap().unwrap();
    assert_eq!(fresh.version, 1);
    assert_eq!(policies.policy(&owner("policies-other")).await.unwrap().version, 0, "per owner");
    // A reader that knows a version gets the document only once it changed.
    assert_eq!(policies.policy_unless(&acme, 3).await.unwrap(), None);
    assert_eq!(policies.policy_unless(&acme, 2).await.unwrap(), Some(third.clone()));
    assert_eq!(policies.policy_unless(&owner("policies-other"), 0).await.unwrap(), None, "none put: version 0");
    assert_eq!(policies.policy_unless(&owner("policies-other"), 4).await.unwrap(), Some(Default::default()));

    // Three calls decided by a person (approve, edit, reject), one by a
    // rule, one still pending, and a script action: only the first three
    // are history.
    let policy = ExecutionPolicy::default();
    let mut runs = Vec::new();
    for (n, agent) in [(1u64, "janitor"), (2, "janitor"), (3, "builder")] {
        let mut run = new_run("policies", 10 + n, 1);
        run.agent = agent.into();
        insert(store, &mut run).await;
        let when = Timestamp::from_millis((T0 + 10 + n) as i64);
        run.claim("w", when, &policy).unwrap();
        let call = |m: u64| ProposedCall { tool: "delete_branch".into(), arguments: serde_json::json!({"n": m}) };
        let id = |m: u128| ApprovalId::from_ulid(Ulid::from_parts(T0 + 10 + n, m));
        let by_rule = agent_runs_domain::ApprovalRequest {
            decided: Some(RuleDecision::Allowed),
            policy: Some(agent_runs_domain::PolicyMatch {
                rule: "r".into(),
                effect: agent_runs_domain::Effect::Allow,
                mode: agent_runs_domain::RuleMode::Enforce,
                version: 2,
            }),
            ..agent_runs_domain::ApprovalRequest::call("a", call(0))
        };
        let requests = vec![
            (id(1), agent_runs_domain::ApprovalRequest::call("a", call(n))),
            (id(2), agent_runs_domain::ApprovalRequest::call("b", call(100 + n))),
            (id(3), by_rule),
            (id(4), "a script's action".into()),
        ];
        run.park("w", requests, serde_json::json!({}), when, &policy).unwrap();
        store.update(&mut run).await.unwrap();
        let decision = match n {
            1 => Decision::Approve,
            2 => Decision::Edit(serde_json::json!({"n": 20})),
            _ => Decision::Reject,
        };
        let request = DecisionRequest { decision, comment: None, seen_sha256: None, decided_by: Some(key) };
        let decided_at = Timestamp::from_millis((T0 + 1_000 - n) as i64);
        run.decide(id(1), request, decided_at, &policy).unwrap();
        let action =
            DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: Some(key) };
        run.decide(id(4), action, decided_at, &policy).unwrap();
        store.update(&mut run).await.unwrap();
        assert_eq!(run.approvals[2].resolved_by, Some(Resolver::Policy("r".into())));
        runs.push(run);
    }
    let history = policies.decided_calls(&acme, 10).await.unwrap();
    let seen: Vec<(u64, &str, &str, HumanDecision)> = history
        .iter()
        .map(|call| (call.arguments["n"].as_u64().unwrap(), call.agent.as_str(), call.tool.as_str(), call.human))
        .collect();
    // Newest decision first: run 1 was decided last.
    assert_eq!(
        seen,
        [
            (1, "janitor", "delete_branch", HumanDecision::Approved),
            (2, "janitor", "delete_branch", HumanDecision::Edited),
            (3, "builder", "delete_branch", HumanDecision::Rejected),
        ],
        "as proposed, not as edited"
    );
    assert_eq!((history[0].run_id, history[0].approval_id), (runs[0].id, runs[0].approvals[0].id));
    assert_eq!(policies.decided_calls(&acme, 2).await.unwrap(), history[..2]);
    assert!(policies.decided_calls(&owner("policies-other"), 10).await.unwrap().is_empty());
}

/// Decisions people made before the history had its index (their event
/// items without its keys, as an earlier release wrote them) are put into
/// it by `aws-migrate`'s pass, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn dynamodb_decisions_made_before_the_index_are_indexed() {
    use agent_runs_domain::{ApprovalRequest, ProposedCall};
    use aws_sdk_dynamodb::types::AttributeValue;
    if emulator::without_emulator("dynamodb_decisions_made_before_the_index_are_indexed") {
        return;
    }
    let (client, table) = fresh_table().await;
    let store = DynamoStore::new(client.clone(), table.clone());
    let policy = ExecutionPolicy::default();
    let key = KeyId::from_ulid(Ulid::from_parts(T0, 5));
    let mut run = new_run("indexed", 1, 1);
    insert(&store, &mut run).await;
    let at = Timestamp::from_millis(T0 as i64 + 1);
    run.claim("w", at, &policy).unwrap();
    let (first, second) =
        (ApprovalId::from_ulid(Ulid::from_parts(T0 + 1, 1)), ApprovalId::from_ulid(Ulid::from_parts(T0 + 1, 2)));
    let call =
        |branch: &str| ProposedCall { tool: "delete_branch".into(), arguments: serde_json::json!({"branch": branch}) };
    let requests =
        vec![(first, ApprovalRequest::call("a", call("old"))), (second, ApprovalRequest::call("b", call("main")))];
    run.park("w", requests, serde_json::json!({}), at, &policy).unwrap();
    store.update(&mut run).await.unwrap();
    let approve =
        DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: Some(key) };
    run.decide(first, approve, Timestamp::from_millis(T0 as i64 + 2), &policy).unwrap();
    // A comment naming the other approval does not confuse the two.
    let comment = Some(format!("unlike {first}"));
    let reject = DecisionRequest { decision: Decision::Reject, comment, seen_sha256: None, decided_by: Some(key) };
    run.decide(second, reject, Timestamp::from_millis(T0 as i64 + 3), &policy).unwrap();
    store.update(&mut run).await.unwrap();
    let indexed = store.decided_calls(&owner("indexed"), 10).await.unwrap();
    assert_eq!(indexed.iter().map(|call| call.approval_id).collect::<Vec<_>>(), [second, first]);

    // As an earlier release left it: the event item without the index's
    // keys and the call.
    let items = client.scan().table_name(&table).send().await.unwrap().items.unwrap_or_default();
    let decided: Vec<_> =
        items.iter().filter(|item| item.get("type") == Some(&AttributeValue::S("approval.decided".into()))).collect();
    assert_eq!(decided.len(), 2);
    for item in decided {
        client
            .update_item()
            .table_name(&table)
            .key("pk", item["pk"].clone())
            .key("sk", item["sk"].clone())
            .update_expression("REMOVE gsi4pk, gsi4sk, call_tool, call_arguments, decision")
            .send()
            .await
            .unwrap();
    }
    assert!(store.decided_calls(&owner("indexed"), 10).await.unwrap().is_empty());

    assert_eq!(store.index_decisions().await.unwrap(), 2);
    assert_eq!(store.decided_calls(&owner("indexed"), 10).await.unwrap(), indexed, "as a release of now writes it");
    assert_eq!(store.index_decisions().await.unwrap(), 0, "once");
}
