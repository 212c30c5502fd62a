//! Scopes, decisions, the inbox and batches, the script agent, limits and a defined agent.

use super::*;

// ---------------------------------------------------------------- scopes

/// The id of a key, from a run it created.
pub(super) fn key_id_of(server: &Server, key: &str) -> Value {
    let run = server.create(key, json!({"input": "who am I"}));
    run["created_by"].clone()
}

/// The id of the key named `name` (`agent-runs keys list`).
pub(super) fn key_id(server: &Server, name: &str) -> String {
    let listed = server.admin(&["keys", "list"]);
    let line = listed.lines().find(|line| line.trim_end().ends_with(&format!("  {name}"))).expect("the key is listed");
    line.split_whitespace().next().unwrap().to_owned()
}

pub(super) fn scopes_limit_what_a_key_may_do_and_decisions_name_their_key(target: Target) {
    let server = Server::start_on(target, &[]);
    let scoped = |name: &str, scopes: &[&str]| {
        let mut args = vec!["keys", "create", "--owner", "dev", "--name", name];
        for scope in scopes {
            args.extend(["--scope", scope]);
        }
        server.admin(&args).trim().to_owned()
    };
    let reader = scoped("reader", &["runs:read"]);
    scoped("writer", &["runs:write"]);
    let approver = scoped("approver", &["approvals:decide"]);

    // The owner's keys by name, the caller's marked; never another owner's.
    server.key("someone-else");
    let listed = server.get(&reader, "/v1/keys").expect_status(200).clone();
    let names: Vec<_> = listed["data"].as_array().unwrap().iter().map(|key| key["name"].clone()).collect();
    assert_eq!(names[names.len() - 3..], [json!("reader"), json!("writer"), json!("approver")], "{listed}");
    let reading = listed["data"].as_array().unwrap().iter().find(|key| key["name"] == "reader").unwrap();
    assert_eq!(reading["id"].as_str(), Some(key_id(&server, "reader").as_str()));
    assert_eq!(
        (&reading["scopes"], &reading["current"], &reading["revoked_at"]),
        (&json!(["runs:read"]), &json!(true), &Value::Null)
    );
    let current: Vec<_> = listed["data"].as_array().unwrap().iter().filter(|key| key["current"] == true).collect();
    assert_eq!(current.len(), 1, "{listed}");
    server.admin(&["keys", "revoke", &key_id(&server, "writer")]);
    let listed = server.get(&approver, "/v1/keys").expect_status(200).clone();
    let revoked = listed["data"].as_array().unwrap().iter().find(|key| key["name"] == "writer").unwrap();
    assert!(is_timestamp(&revoked["revoked_at"]), "{listed}");
    server.get(&reader, "/v1/keys?limit=5").expect_error(400, "invalid_request");
    let hooks = scoped("hooks", &["webhooks:manage"]);
    server.get(&hooks, "/v1/keys").expect_error(403, "forbidden");
    // What a client may know of an agent.
    let echo = server.get(&reader, "/v1/agents/echo").expect_status(200).clone();
    assert_eq!((&echo["name"], &echo["separate_approver"]), (&json!("echo"), &json!(false)));
    server.get(&reader, "/v1/agents/nope").expect_error(404, "not_found");
    let writer = scoped("writer-2", &["runs:write"]);

    let run = server.create_script(&writer, "approve Ship it");
    assert_eq!(run["created_by"].as_str(), Some(key_id(&server, "writer-2").as_str()), "the run names its creator");
    let run = server.wait_for_status(&reader, run["id"].as_str().unwrap(), "awaiting_approval");
    server.get(&reader, &format!("{}/events", run_path(&run))).expect_status(200);
    server.get(&approver, "/v1/agent/runs").expect_status(200);
    server.get(&approver, "/v1/approvals").expect_status(200);
    let error = server.get(&writer, "/v1/approvals").expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("approvals:decide"), "{error}");
    let extend = format!("{}/approvals/{}/extend", run_path(&run), run["pending_approvals"][0]["id"].as_str().unwrap());
    server.post(&reader, &extend, json!({"seconds": 60})).expect_error(403, "forbidden");

    // The missing scope is named, and checked before the request is.
    let error = server.post(&reader, "/v1/agent/runs", json!({"input": ""})).expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("runs:write"), "{error}");
    server.post(&reader, &format!("{}/cancel", run_path(&run)), json!({})).expect_error(403, "forbidden");
    let decision = format!("{}/approvals/{}", run_path(&run), run["pending_approvals"][0]["id"].as_str().unwrap());
    let error = server.post(&writer, &decision, json!({"decision": "approve"})).expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("approvals:decide"), "{error}");
    server.post(&approver, "/v1/agent/runs", json!({"input": "x"})).expect_error(403, "forbidden");

    let decided = server.post(&approver, &decision, json!({"decision": "approve"})).expect_status(200).clone();
    assert_eq!(decided["pending_approvals"][0]["resolved_by"].as_str(), Some(key_id(&server, "approver").as_str()));
    assert_eq!(run["pending_approvals"][0]["resolved_by"], Value::Null, "null while pending");
    // A key made without --scope may do everything.
    let dev = server.dev_key.clone().unwrap();
    let own = server.create_script(&dev, "approve Hold");
    server.post(&dev, &format!("{}/cancel", run_path(&own)), json!({})).expect_status(200);

    let refused = server.admin_output(&["keys", "create", "--owner", "dev", "--scope", "runs:delete"]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("runs:delete") && said.contains("approvals:decide"), "{said}");
}

// ---------------------------------------------------------------- approvals and the script agent

pub(super) fn approve_resumes_the_script_and_repeats_are_safe(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "say hello\n\napprove Delete 3 stale branches\nsay done\n");
    let run = server.wait_for_status(&key, run["id"].as_str().unwrap(), "awaiting_approval");
    let approvals = run["pending_approvals"].as_array().unwrap();
    assert_eq!(approvals.len(), 1);
    let approval = &approvals[0];
    assert_eq!(approval["action"], "Delete 3 stale branches");
    assert_eq!(approval["status"], "pending");
    assert!(approval["id"].as_str().unwrap().starts_with("apr_"));
    assert!(is_timestamp(&approval["requested_at"]));
    assert_eq!(approval["resolved_at"], Value::Null);
    assert_eq!(run["output"], Value::Null);

    let path = format!("{}/approvals/{}", run_path(&run), approval["id"].as_str().unwrap());
    let decided =
        server.post(&key, &path, json!({"decision": "approve", "comment": "fine"})).expect_status(200).clone();
    assert_eq!(decided["pending_approvals"][0]["status"], "approved");
    assert_eq!(decided["pending_approvals"][0]["comment"], "fine");
    assert!(is_timestamp(&decided["pending_approvals"][0]["resolved_at"]));
    assert!(["queued", "running", "succeeded"].contains(&decided["status"].as_str().unwrap()));

    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(done["output"], "hello\napproved: Delete 3 stale branches\ndone");
    assert_eq!(done["pending_approvals"][0]["status"], "approved");

    // Repeating the decision answers 200 with the run as it is now.
    let repeat = server.post(&key, &path, json!({"decision": "approve"})).expect_status(200).clone();
    assert_eq!(repeat, done);
    server.post(&key, &path, json!({"decision": "reject"})).expect_error(409, "conflict");
}

pub(super) fn reject_lets_the_script_go_on(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "approve Send the email\napprove Archive\nsay end");
    let id = run["id"].as_str().unwrap();
    let run = server.wait_for_status(&key, id, "awaiting_approval");
    let first = format!("{}/approvals/{}", run_path(&run), run["pending_approvals"][0]["id"].as_str().unwrap());
    server.post(&key, &first, json!({"decision": "reject"})).expect_status(200);
    let run = server.wait_for(&key, id, Duration::from_secs(20), |run| {
        run["status"] == "awaiting_approval" && run["pending_approvals"].as_array().unwrap().len() == 2
    });
    assert_eq!(run["pending_approvals"][0]["status"], "rejected");
    assert_eq!(run["pending_approvals"][0]["comment"], Value::Null);
    let second = format!("{}/approvals/{}", run_path(&run), run["pending_approvals"][1]["id"].as_str().unwrap());
    server.post(&key, &second, json!({"decision": "approve"})).expect_status(200);
    let done = server.wait_for_status(&key, id, "succeeded");
    assert_eq!(done["output"], "rejected: Send the email\napproved: Archive\nend");
    server.post(&key, &first, json!({"decision": "reject"})).expect_status(200);
    server.post(&key, &first, json!({"decision": "approve"})).expect_error(409, "conflict");
}

pub(super) fn decide_validates_its_body_and_ids(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "approve Go");
    let run = server.wait_for_status(&key, run["id"].as_str().unwrap(), "awaiting_approval");
    let path = format!("{}/approvals/{}", run_path(&run), run["pending_approvals"][0]["id"].as_str().unwrap());
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "decision"),
        (json!({"decision": "maybe"}), "decision"),
        (json!({"decision": true}), "decision"),
        (json!({"decision": "approve", "comment": 5}), "comment"),
        (json!({"decision": "approve", "comment": "é".repeat(1_001)}), "comment"),
        (json!({"decision": "approve", "why": "x"}), "why"),
        (json!({"decision": "edit"}), "arguments"),
        (json!({"decision": "edit", "arguments": [1]}), "arguments"),
        (json!({"decision": "approve", "arguments": {}}), "arguments"),
        (json!({"decision": "edit", "arguments": {}}), "decision"),
        (json!({"decision": "approve", "arguments_sha256": "xyz"}), "arguments_sha256"),
    ];
    for (body, param) in cases {
        let error = server.post(&key, &path, body.clone()).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param, "{body}");
    }
    server.send(server.request("POST", &path).bearer_auth(&key)).expect_error(400, "invalid_request");
    let unknown_approval = format!("{}/approvals/apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9", run_path(&run));
    server.post(&key, &unknown_approval, json!({"decision": "approve"})).expect_error(404, "not_found");
    server
        .post(&key, &format!("{}/approvals/nope", run_path(&run)), json!({"decision": "approve"}))
        .expect_error(404, "not_found");
    let unknown_run = format!("{RUNS}/{UNKNOWN_RUN}/approvals/{}", run["pending_approvals"][0]["id"].as_str().unwrap());
    server.post(&key, &unknown_run, json!({"decision": "approve"})).expect_error(404, "not_found");
    // An action has no arguments: a decision bound to some is for another call.
    let bound = json!({"decision": "approve", "arguments_sha256": "0".repeat(64)});
    server.post(&key, &path, bound).expect_error(409, "conflict");
    // Still pending after all that; a comment of exactly 1,000 characters is fine.
    let run = server
        .post(&key, &path, json!({"decision": "reject", "comment": "é".repeat(1_000)}))
        .expect_status(200)
        .clone();
    assert_eq!(run["pending_approvals"][0]["status"], "rejected");
    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(done["output"], "rejected: Go");
}

pub(super) fn the_inbox_lists_approvals_across_runs_newest_first(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let first = server.create_script(&key, "approve Rotate the keys");
    let first = server.wait_for_status(&key, first["id"].as_str().unwrap(), "awaiting_approval");
    let second = server.create_script(&key, "approve Ship it");
    let second = server.wait_for_status(&key, second["id"].as_str().unwrap(), "awaiting_approval");

    let page = server.get(&key, "/v1/approvals").expect_status(200).clone();
    let entries = page["data"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{page}");
    assert_eq!(page["next_cursor"], Value::Null);
    let newest = &entries[0];
    assert_eq!((&newest["run_id"], &newest["action"]), (&second["id"], &json!("Ship it")));
    assert_eq!((&newest["agent"], &newest["run_status"]), (&json!("script"), &json!("awaiting_approval")));
    assert_eq!((&newest["kind"], &newest["status"]), (&json!("action"), &json!("pending")));
    for absent in ["tool", "arguments", "arguments_sha256", "edited_arguments", "resolved_by"] {
        assert_eq!(newest[absent], Value::Null, "{absent}");
    }
    assert_eq!(entries[1]["run_id"], first["id"]);

    // Pages of one: the cursor leads on, and the last page says so.
    let one = server.get(&key, "/v1/approvals?limit=1").expect_status(200).clone();
    assert_eq!(one["data"][0]["id"], newest["id"]);
    let cursor = one["next_cursor"].as_str().unwrap().to_owned();
    let rest = server.get(&key, &format!("/v1/approvals?limit=1&cursor={cursor}")).expect_status(200).clone();
    assert_eq!((&rest["data"][0]["id"], &rest["next_cursor"]), (&entries[1]["id"], &Value::Null));
    let other_filter = format!("/v1/approvals?status=approved&cursor={cursor}");
    assert_eq!(server.get(&key, &other_filter).expect_error(400, "invalid_request")["param"], "cursor");
    let by_agent = server.get(&key, "/v1/approvals?agent=script&status=").expect_status(200).clone();
    assert_eq!(by_agent["data"].as_array().unwrap().len(), 2);
    let none = server.get(&key, "/v1/approvals?agent=echo").expect_status(200).clone();
    assert_eq!(none, json!({"data": [], "next_cursor": null}));
    for (query, param) in
        [("status=waiting", "status"), ("agent=no%20such", "agent"), ("limit=101", "limit"), ("sort=asc", "sort")]
    {
        let reply = server.get(&key, &format!("/v1/approvals?{query}"));
        assert_eq!(reply.expect_error(400, "invalid_request")["param"], param, "{query}");
    }

    // A decision moves the approval from the pending inbox to the approved one.
    let decide = format!("{}/approvals/{}", run_path(&second), newest["id"].as_str().unwrap());
    server.post(&key, &decide, json!({"decision": "approve"})).expect_status(200);
    let pending = server.get(&key, "/v1/approvals").expect_status(200).clone();
    assert_eq!(pending["data"].as_array().unwrap().len(), 1);
    assert_eq!(pending["data"][0]["run_id"], first["id"]);
    server.wait_for_status(&key, second["id"].as_str().unwrap(), "succeeded");
    let approved = server.get(&key, "/v1/approvals?status=approved").expect_status(200).clone();
    assert_eq!(approved["data"][0]["id"], newest["id"]);
    assert_eq!(approved["data"][0]["run_status"], "succeeded");
    assert!(approved["data"][0]["resolved_by"].as_str().unwrap().starts_with("key_"));
    // Another owner sees none of it.
    let stranger = server.key("someone-else");
    let theirs = server.get(&stranger, "/v1/approvals").expect_status(200).clone();
    assert_eq!(theirs["data"], json!([]));
}

pub(super) fn a_batch_decides_across_runs_all_or_nothing(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let waiting: Vec<Value> = ["approve Deploy", "approve Notify", "approve Archive"]
        .iter()
        .map(|script| {
            let run = server.create_script(&key, &format!("{script}\nsay done"));
            server.wait_for_status(&key, run["id"].as_str().unwrap(), "awaiting_approval")
        })
        .collect();
    let element = |run: &Value, decision: &str| json!({"run_id": run["id"], "approval_id": run["pending_approvals"][0]["id"], "decision": decision});
    let batch = "/v1/approvals/batch";
    let (a, b, c) = (&waiting[0], &waiting[1], &waiting[2]);

    let too_many: Vec<Value> = (0..101).map(|_| element(a, "approve")).collect();
    for body in [json!({}), json!({"decisions": []}), json!({"decisions": too_many}), json!({"decisions": {}})] {
        assert_eq!(server.post(&key, batch, body).expect_error(400, "invalid_request")["param"], "decisions");
    }
    let cases: Vec<(Value, u16, &str, u64)> = vec![
        (json!([element(a, "approve"), element(a, "reject")]), 400, "invalid_request", 1),
        (json!([element(a, "approve"), 7]), 400, "invalid_request", 1),
        (json!([element(a, "approve"), {"run_id": a["id"], "decision": "approve"}]), 400, "invalid_request", 1),
        (json!([element(a, "approve"), element(b, "maybe")]), 400, "invalid_request", 1),
        (
            json!([element(a, "approve"), {"run_id": UNKNOWN_RUN, "approval_id": a["pending_approvals"][0]["id"], "decision": "approve"}]),
            404,
            "not_found",
            1,
        ),
        (
            json!([element(a, "approve"), element(b, "approve"), {"run_id": c["id"], "approval_id": c["pending_approvals"][0]["id"], "decision": "edit", "arguments": {}}]),
            400,
            "invalid_request",
            2,
        ),
    ];
    for (decisions, status, code, index) in cases {
        let reply = server.post(&key, batch, json!({"decisions": decisions}));
        assert_eq!(reply.expect_error(status, code)["index"], index, "{decisions}");
    }
    // A decision that conflicts leaves the others unrecorded too.
    let c_path = format!("{}/approvals/{}", run_path(c), c["pending_approvals"][0]["id"].as_str().unwrap());
    server.post(&key, &c_path, json!({"decision": "reject"})).expect_status(200);
    let conflicting = json!({"decisions": [element(a, "approve"), element(c, "approve")]});
    assert_eq!(server.post(&key, batch, conflicting).expect_error(409, "conflict")["index"], 1);
    let a_now = server.get(&key, &run_path(a)).expect_status(200).clone();
    assert_eq!(a_now["pending_approvals"][0]["status"], "pending", "nothing of the batch was recorded");

    let mut reject_b = element(b, "reject");
    reject_b["comment"] = json!("not today");
    let body = json!({"decisions": [element(a, "approve"), reject_b, element(c, "reject")]});
    let decided = server.post(&key, batch, body.clone()).expect_status(200).clone();
    let runs = decided["data"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!((&runs[0]["id"], &runs[1]["id"], &runs[2]["id"]), (&a["id"], &b["id"], &c["id"]));
    assert_eq!(runs[0]["pending_approvals"][0]["status"], "approved");
    assert_eq!(runs[1]["pending_approvals"][0]["comment"], "not today");
    let a_done = server.wait_for_status(&key, a["id"].as_str().unwrap(), "succeeded");
    assert_eq!(a_done["output"], "approved: Deploy\ndone");
    let b_done = server.wait_for_status(&key, b["id"].as_str().unwrap(), "succeeded");
    assert_eq!(b_done["output"], "rejected: Notify\ndone");
    // Repeating the batch is safe, and each run was resumed once.
    server.post(&key, batch, body).expect_status(200);
    for run in [a, b] {
        let events = server.get(&key, &format!("{}/events", run_path(run))).expect_status(200).clone();
        assert_eq!(event_types(&events).iter().filter(|kind| *kind == "run.resumed").count(), 1);
    }
    let reader = server.admin(&["keys", "create", "--owner", "dev", "--scope", "runs:read"]).trim().to_owned();
    server.post(&reader, batch, json!({"decisions": [element(a, "approve")]})).expect_error(403, "forbidden");
}

pub(super) fn the_script_agent_says_sleeps_and_fails(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "say one\nsleep 50\nsay two three\n\nsay");
    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(done["output"], "one\ntwo three\n");
    assert_eq!(done["error"], Value::Null);

    let run = server.create_script(&key, "say before\nfail The disk is full\nsay after");
    let failed = server.wait_for_status(&key, run["id"].as_str().unwrap(), "failed");
    assert_eq!(failed["error"], "The disk is full");
    assert_eq!(failed["output"], Value::Null);
    assert!(is_timestamp(&failed["completed_at"]));

    let run = server.create_script(&key, "\n\n");
    let empty = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(empty["output"], "", "output may be the empty string");
}

// ---------------------------------------------------------------- limits

pub(super) fn too_many_active_runs_answer_429_with_retry_after(target: Target) {
    let server = Server::start_on(target, &[("AGENT_RUNS_MAX_ACTIVE_RUNS", "2")]);
    let key = server.dev_key.clone().unwrap();
    let a = server.create_script(&key, "approve A");
    server.create_script(&key, "approve B");
    let reply = server.post(&key, RUNS, json!({"input": "x"}));
    reply.expect_error(429, "rate_limited");
    assert!(reply.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    // Other owners are not affected; finishing a run frees a slot.
    let other = server.key("other");
    server.create(&other, json!({"input": "x"}));
    server.post(&key, &format!("{}/cancel", run_path(&a)), json!({})).expect_status(200);
    server.create(&key, json!({"input": "x"}));
}

pub(super) fn requests_over_the_rate_limit_answer_429_with_retry_after(target: Target) {
    let server =
        Server::start_on(target, &[("AGENT_RUNS_RATE_LIMIT_PER_SECOND", "1"), ("AGENT_RUNS_RATE_LIMIT_BURST", "3")]);
    let key = server.dev_key.clone().unwrap();
    let statuses: Vec<u16> = (0..5).map(|_| server.get(&key, RUNS).status).collect();
    assert_eq!(&statuses[..3], &[200, 200, 200]);
    let reply = server.get(&key, RUNS);
    reply.expect_error(429, "rate_limited");
    assert!(reply.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
}

// ---------------------------------------------------------------- defined agents

pub(super) fn a_defined_agent_is_managed_with_the_cli_and_waits_for_approval(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(stand_in::StandIn::start());
    model.script(vec![
        stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        stand_in::text("Deleted old."),
    ]);
    let server = Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0")]);
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    let toml = support::janitor_definition(&model.url, "separate_approver = true\nmax_total_tokens = 1000");
    // Without the opt-in, a tool on 127.0.0.1 could never be called: refused.
    std::fs::write(&file, toml.replace("allow_private_network = true", "")).unwrap();
    let refused = server.admin_output(&["agents", "put", "--file", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("allow_private_network = true"), "{stderr}");
    assert!(!server.admin(&["agents", "list"]).contains("janitor"));

    std::fs::write(&file, toml).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);
    assert!(
        server
            .admin(&["agents", "list"])
            .lines()
            .any(|line| line.starts_with("janitor") && line.contains("delete_branch (approval)"))
    );
    let shown: Value = serde_json::from_str(&server.admin(&["agents", "get", "janitor"])).unwrap();
    assert_eq!(shown["tools"][0]["requires_approval"], true);
    let about = server.get(&key, "/v1/agents/janitor").expect_status(200).clone();
    assert_eq!(about, json!({"name": "janitor", "description": shown["description"], "separate_approver": true}));
    assert_eq!(shown["allow_private_network"], true);
    assert_eq!(shown["separate_approver"], true);

    for (budget, param) in [
        (json!({"max_total_tokens": 1001}), "budget.max_total_tokens"),
        (json!({"max_total_tokens": 0}), "budget.max_total_tokens"),
        (json!({"max_tool_calls": -1}), "budget.max_tool_calls"),
        (json!({"max_tool_calls": 1.5}), "budget.max_tool_calls"),
        (json!({"max_tool_calls": 9_007_199_254_740_992u64}), "budget.max_tool_calls"),
        (json!({"max_dollars": 1}), "max_dollars"),
        (json!(7), "budget"),
    ] {
        let reply = server.post(&key, RUNS, json!({"agent": "janitor", "input": "x", "budget": budget}));
        assert_eq!(reply.expect_error(400, "invalid_request")["param"], param, "{budget}");
    }
    let budget = json!({"max_total_tokens": 1000, "max_tool_calls": 5});
    let run = server.create(&key, json!({"agent": "janitor", "input": "Delete the branch old", "budget": budget}));
    assert_eq!(run["budget"], budget);
    assert_eq!(run["agent"], "janitor");
    assert!(run.get("usage").is_none(), "no usage before the model reported any");
    let waiting = server.wait_for_status(&key, run["id"].as_str().unwrap(), "awaiting_approval");
    let approval = &waiting["pending_approvals"][0];
    assert_eq!(approval["action"], r#"Call the tool `delete_branch` with {"branch":"old"}"#);
    assert_eq!((&approval["kind"], &approval["tool"]), (&json!("tool_call"), &json!("delete_branch")));
    assert_eq!(approval["arguments"], json!({"branch": "old"}));
    // printf '%s' '{"branch":"old"}' | sha256sum
    let digest = "d5452dfb77be7dc74e9780744bb1e0234297d52fca8d58a22d737eb81caa723b";
    assert_eq!(approval["arguments_sha256"], digest);
    assert_eq!(approval["edited_arguments"], Value::Null);
    assert!(model.tool_calls().is_empty());
    let path = format!("{}/approvals/{}", run_path(&run), approval["id"].as_str().unwrap());
    // Another person decides: the key that created the run may not.
    let error = server.post(&key, &path, json!({"decision": "approve"})).expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("another API key"), "{error}");
    server.post(&key, &format!("{path}/extend"), json!({"seconds": 60})).expect_error(403, "forbidden");
    let second = server.key("dev");
    // An edit is checked against the tool's schema; a stale digest changes nothing.
    let wrong = json!({"decision": "edit", "arguments": {"branch": 7}, "arguments_sha256": digest});
    let error = server.post(&second, &path, wrong).expect_error(400, "invalid_request").clone();
    assert_eq!(error["param"], "arguments");
    assert!(error["message"].as_str().unwrap().contains("/branch"), "{error}");
    // A number a browser (or JCS) would read as another number is refused,
    // so what a person sees, the digest and the tool's input stay one value.
    let inexact: Value =
        serde_json::from_str(r#"{"decision": "edit", "arguments": {"branch": 12345678901234567891}}"#).unwrap();
    let error = server.post(&second, &path, inexact).expect_error(400, "invalid_request").clone();
    assert_eq!(error["param"], "arguments");
    assert!(error["message"].as_str().unwrap().contains("12345678901234567891"), "{error}");
    let stale = json!({"decision": "edit", "arguments": {"branch": "stale"}, "arguments_sha256": "ab".repeat(32)});
    server.post(&second, &path, stale).expect_error(409, "conflict");
    let extended =
        server.post(&second, &format!("{path}/extend"), json!({"seconds": 604_800})).expect_status(200).clone();
    assert!(extended["pending_approvals"][0]["expires_at"].as_str() > approval["expires_at"].as_str(), "{extended}");
    for seconds in [json!(59), json!(604_801), json!("60"), json!(null)] {
        let reply = server.post(&second, &format!("{path}/extend"), json!({"seconds": seconds}));
        assert_eq!(reply.expect_error(400, "invalid_request")["param"], "seconds");
    }
    let edit = json!({"decision": "edit", "arguments": {"branch": "older"}, "arguments_sha256": digest.to_uppercase()});
    let decided = server.post(&second, &path, edit.clone()).expect_status(200).clone();
    assert_eq!(decided["pending_approvals"][0]["resolved_by"], key_id_of(&server, &second));
    assert_eq!(decided["pending_approvals"][0]["status"], "approved");
    assert_eq!(decided["pending_approvals"][0]["edited_arguments"], json!({"branch": "older"}));
    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(done["output"], "Deleted old.");
    assert_eq!(done["usage"], json!({"input_tokens": 20, "output_tokens": 10, "total_tokens": 30, "tool_calls": 1}));
    let calls = model.tool_calls();
    assert_eq!(calls.len(), 1, "the edited call, once");
    assert_eq!(serde_json::from_str::<Value>(&calls[0].body).unwrap(), json!({"branch": "older"}));
    // The same edit again is a repeat; another decision is not.
    server.post(&second, &path, edit).expect_status(200);
    server.post(&second, &path, json!({"decision": "approve"})).expect_error(409, "conflict");
    server.post(&second, &format!("{path}/extend"), json!({"seconds": 60})).expect_error(409, "conflict");

    // A run whose budget allows no tool call fails before the call, and
    // nobody is asked to approve it.
    model.script(vec![stand_in::tool_call("call_2", "delete_branch", r#"{"branch":"new"}"#)]);
    let budget = json!({"max_tool_calls": 0.0});
    let run = server.create(&key, json!({"agent": "janitor", "input": "Delete new", "budget": budget}));
    let failed = server.wait_for_status(&key, run["id"].as_str().unwrap(), "failed");
    assert_eq!(failed["error"], "budget exceeded: the run made 0 tool calls of its 0.");
    assert_eq!(failed["pending_approvals"], json!([]));
    assert_eq!(model.tool_calls().len(), 1, "the call was not made");

    server.admin(&["agents", "delete", "janitor"]);
    let reply = server.post(&key, RUNS, json!({"agent": "janitor", "input": "again"}));
    reply.expect_error(400, "invalid_request");
    assert_eq!(reply.body["error"]["param"], "agent");
}
