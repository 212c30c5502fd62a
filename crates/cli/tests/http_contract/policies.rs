//! Approval policies: one document per owner, replaced whole and
//! conditionally, tried on the calls people decided, then enforced.

use super::*;

fn put(server: &Server, key: &str, if_match: Option<&str>, body: Value) -> support::Reply {
    let mut request = server.request("PUT", "/v1/policies").bearer_auth(key).json(&body);
    if let Some(version) = if_match {
        request = request.header("If-Match", version);
    }
    server.send(request)
}

fn etag(reply: &support::Reply) -> &str {
    reply.headers.get("etag").and_then(|value| value.to_str().ok()).unwrap_or_default()
}

pub(super) fn policies_are_replaced_whole_conditionally_tried_on_history_and_enforced(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(stand_in::StandIn::start());
    model.script(vec![
        stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        stand_in::text("Deleted old."),
        stand_in::tool_call("call_2", "delete_branch", r#"{"branch":"main"}"#),
        stand_in::text("main stays."),
    ]);
    let server = Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0")]);
    let dev = server.dev_key.clone().unwrap();
    let scoped = |name: &str, scope: &str| {
        server.admin(&["keys", "create", "--owner", "dev", "--name", name, "--scope", scope]).trim().to_owned()
    };
    let reader = scoped("reader", "runs:read");
    let manager = scoped("manager", "policies:manage");

    // Never put: version 0, which If-Match "0" matches.
    let empty = server.get(&reader, "/v1/policies");
    assert_eq!(empty.expect_status(200), &json!({"version": 0, "rules": [], "updated_at": null, "updated_by": null}));
    assert_eq!(etag(&empty), "\"0\"");
    let rules = json!({"rules": [{"id": "no-deletes", "tool": "delete_*", "effect": "deny", "reason": "not today"}]});
    let error = put(&server, &reader, None, rules.clone()).expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("policies:manage"), "{error}");
    server.post(&reader, "/v1/policies/test", rules.clone()).expect_error(403, "forbidden");

    // A malformed rule names its index and field, and changes nothing.
    let bad = json!({"rules": [{"id": "a", "effect": "allow"}, {"id": "b", "effect": "deny", "when": [{"path": "/n", "op": "~", "value": 1}]}]});
    let error = put(&server, &manager, Some("\"0\""), bad).expect_error(400, "invalid_request").clone();
    assert_eq!((&error["index"], &error["param"]), (&json!(1), &json!("rules[1].when[0].op")));
    for (body, param) in [
        (
            json!({"rules": [{"id": "a", "effect": "allow", "when": [{"path": "/s", "op": "matches", "value": "("}]}]}),
            "rules[0].when[0].value",
        ),
        (json!({"rules": [{"id": "a", "effect": "allow"}, {"id": "a", "effect": "ask"}]}), "rules[1].id"),
        (json!({"rules": [{"id": "a", "effect": "allow", "colour": "red"}]}), "rules[0].colour"),
    ] {
        assert_eq!(put(&server, &manager, None, body).expect_error(400, "invalid_request")["param"], param);
    }
    assert_eq!(
        put(&server, &manager, Some("W/\"3\""), rules.clone()).expect_error(400, "invalid_request")["param"],
        "If-Match"
    );
    assert_eq!(server.get(&reader, "/v1/policies").expect_status(200)["version"], 0);

    let first = put(&server, &manager, Some("\"0\""), rules.clone());
    let policy = first.expect_status(200).clone();
    assert_eq!(etag(&first), "\"1\"");
    assert_eq!(policy["version"], 1);
    assert_eq!(policy["updated_by"].as_str(), Some(key_id(&server, "manager").as_str()));
    assert!(is_timestamp(&policy["updated_at"]));
    assert_eq!(
        policy["rules"],
        json!([{"id": "no-deletes", "agent": "*", "tool": "delete_*", "effect": "deny", "mode": "enforce", "reason": "not today", "when": []}])
    );
    // Another writer that read version 0 is refused; without If-Match a put
    // replaces whatever is there.
    put(&server, &manager, Some("\"0\""), json!({"rules": []})).expect_error(412, "precondition_failed");
    assert_eq!(server.get(&manager, "/v1/policies").expect_status(200), &policy, "policies:manage reads too");
    assert_eq!(put(&server, &manager, None, json!({"rules": []})).expect_status(200)["version"], 2);

    // History: a person approves a call; the candidate rule would have
    // denied it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    std::fs::write(&file, support::janitor_definition(&model.url, "")).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);
    let run = server.create(&dev, json!({"agent": "janitor", "input": "Delete old"}));
    let run = server.wait_for_status(&dev, run["id"].as_str().unwrap(), "awaiting_approval");
    let approval = &run["pending_approvals"][0];
    assert_eq!(approval["policy"], Value::Null, "no rule matched: the tool asked");
    let decision = format!("{}/approvals/{}", run_path(&run), approval["id"].as_str().unwrap());
    server.post(&dev, &decision, json!({"decision": "approve"})).expect_status(200);
    server.wait_for_status(&dev, run["id"].as_str().unwrap(), "succeeded");
    let tried = server.post(&manager, "/v1/policies/test", rules.clone()).expect_status(200).clone();
    assert_eq!(
        (&tried["evaluated"], &tried["would_allow"], &tried["would_deny"], &tried["would_ask"]),
        (&json!(1), &json!(0), &json!(1), &json!(0))
    );
    assert_eq!(tried["rules"], json!({"no-deletes": {"matched": 1, "agreed": 0, "disagreed": 1}}));
    let disagreement = &tried["disagreements"][0];
    assert_eq!(
        (&disagreement["run_id"], &disagreement["human"], &disagreement["rule"], &disagreement["effect"]),
        (&run["id"], &json!("approved"), &json!("no-deletes"), &json!("deny"))
    );
    assert_eq!(disagreement["arguments"], json!({"branch": "old"}));
    assert_eq!(server.get(&reader, "/v1/policies").expect_status(200)["version"], 2, "a test changes nothing");
    for (body, param) in [
        (json!({"rules": [], "limit": 0}), "limit"),
        (json!({"rules": [], "limit": 10_001}), "limit"),
        (json!({"rules": [], "dry": true}), "dry"),
    ] {
        let error = server.post(&manager, "/v1/policies/test", body).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param);
    }

    // Enforced: the rule denies the call, no one is asked, the model is told.
    let protect = json!({"rules": [{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "reason": "main is protected",
        "when": [{"path": "/branch", "op": "==", "value": "main"}]}]});
    put(&server, &manager, Some("\"2\""), protect).expect_status(200);
    let run = server.create(&dev, json!({"agent": "janitor", "input": "Delete main"}));
    let run = server.wait_for_status(&dev, run["id"].as_str().unwrap(), "succeeded");
    let denied = &run["pending_approvals"][0];
    assert_eq!((&denied["status"], &denied["resolved_by"]), (&json!("rejected"), &json!("policy:protect-main")));
    assert_eq!(denied["policy"], json!({"rule": "protect-main", "effect": "deny", "mode": "enforce", "version": 3}));
    assert_eq!(denied["resolved_at"], denied["requested_at"]);
    let told = model.model_requests().last().unwrap()["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(told["content"], "denied by policy protect-main: main is protected");
    assert_eq!(model.tool_calls().len(), 1, "only the approved call of the first run reached the tool");
}
