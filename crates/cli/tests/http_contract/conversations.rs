//! Conversations over HTTP: `previous_run_id` checked in the contract's
//! order, the thread listed, idempotency, the CLI, and a defined agent asked
//! a follow-up whose conversation no longer fits whole.

use super::*;

fn thread_page(server: &Server, key: &str, query: &str) -> Value {
    server.get(key, &format!("{RUNS}?{query}")).expect_status(200).clone()
}

pub(super) fn a_run_continues_an_ended_one_checked_in_the_contracts_order(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let other = server.key("other");
    let first = server.create(&key, json!({"agent": "echo", "input": "hello"}));
    let first_id = first["id"].as_str().unwrap().to_owned();
    assert_eq!((&first["thread_id"], &first["previous_run_id"]), (&first["id"], &Value::Null));
    server.wait_for_status(&key, &first_id, "succeeded");
    let busy = server.create_script(&key, "approve Wait for me");
    let busy_id = busy["id"].as_str().unwrap().to_owned();

    let create =
        |api_key: &str, body: Value| server.send(server.request("POST", RUNS).bearer_auth(api_key).json(&body));
    for malformed in [json!("run_nope"), json!(7), json!(""), json!({"id": first_id})] {
        let error = create(&key, json!({"input": "x", "previous_run_id": malformed}))
            .expect_error(400, "invalid_request")
            .clone();
        assert_eq!(error["param"], "previous_run_id", "{malformed}");
    }
    // Unknown and another owner's: 404, before the agent is looked at.
    create(&key, json!({"input": "x", "previous_run_id": UNKNOWN_RUN, "agent": "script"}))
        .expect_error(404, "not_found");
    create(&other, json!({"input": "x", "previous_run_id": first_id})).expect_error(404, "not_found");
    // Another agent named: 400, before whether the run ended.
    let error = create(&key, json!({"input": "x", "previous_run_id": first_id, "agent": "script"}))
        .expect_error(400, "invalid_request")
        .clone();
    assert_eq!(error["param"], "agent");
    let error = create(&key, json!({"input": "x", "previous_run_id": busy_id, "agent": "echo"}))
        .expect_error(400, "invalid_request")
        .clone();
    assert_eq!(error["param"], "agent");
    create(&key, json!({"input": "x", "previous_run_id": busy_id})).expect_error(409, "conflict");

    // The agent left out is the previous run's; echo behaves as before.
    let second = create(&key, json!({"input": "again", "previous_run_id": first_id})).expect_status(201).clone();
    assert_eq!((second["agent"].as_str(), second["thread_id"].as_str()), (Some("echo"), Some(first_id.as_str())));
    assert_eq!(second["previous_run_id"], first_id.as_str());
    let second_id = second["id"].as_str().unwrap().to_owned();
    assert_eq!(server.wait_for_status(&key, &second_id, "succeeded")["output"], "again");
    let third = create(&key, json!({"input": "and again", "previous_run_id": second_id, "agent": "echo"}))
        .expect_status(201)
        .clone();
    assert_eq!(
        (third["thread_id"].as_str(), third["previous_run_id"].as_str()),
        (Some(first_id.as_str()), Some(second_id.as_str()))
    );
    // A canceled run may be continued; so may one run twice (a fork).
    server.post(&key, &format!("{RUNS}/{busy_id}/cancel"), json!({})).expect_status(200);
    let after_cancel =
        create(&key, json!({"input": "say go on", "previous_run_id": busy_id})).expect_status(201).clone();
    assert_eq!(after_cancel["agent"], "script");
    let after_cancel = server.wait_for_status(&key, after_cancel["id"].as_str().unwrap(), "succeeded");
    assert_eq!(after_cancel["output"], "go on", "a script starts afresh, as before");
    let fork = create(&key, json!({"input": "fork", "previous_run_id": first_id})).expect_status(201).clone();
    server.wait_for_status(&key, third["id"].as_str().unwrap(), "succeeded");
    server.wait_for_status(&key, fork["id"].as_str().unwrap(), "succeeded");

    // The thread, newest first, the first run last; in pages; with a status.
    let whole = vec![fork["id"].clone(), third["id"].clone(), second["id"].clone(), first["id"].clone()];
    let page = thread_page(&server, &key, &format!("thread_id={first_id}"));
    assert_eq!(page["data"].as_array().unwrap().iter().map(|run| run["id"].clone()).collect::<Vec<_>>(), whole);
    assert_eq!(page["next_cursor"], Value::Null);
    let first_page = thread_page(&server, &key, &format!("thread_id={first_id}&limit=3"));
    assert_eq!(ids(&first_page).len(), 3);
    let cursor = first_page["next_cursor"].as_str().unwrap().to_owned();
    let rest = thread_page(&server, &key, &format!("thread_id={first_id}&limit=3&cursor={cursor}"));
    assert_eq!(ids(&rest), std::slice::from_ref(&first_id));
    // The cursor is bound to its thread.
    server.get(&key, &format!("{RUNS}?limit=3&cursor={cursor}")).expect_error(400, "invalid_request");
    let succeeded = thread_page(&server, &key, &format!("status=succeeded&thread_id={first_id}"));
    assert_eq!(ids(&succeeded).len(), 4);
    assert!(ids(&thread_page(&server, &key, &format!("status=queued&thread_id={first_id}"))).is_empty());
    // Another owner's thread: an empty page; a malformed id: 400.
    assert!(ids(&thread_page(&server, &other, &format!("thread_id={first_id}"))).is_empty());
    let error = server.get(&key, &format!("{RUNS}?thread_id=nope")).expect_error(400, "invalid_request").clone();
    assert_eq!(error["param"], "thread_id");

    // Idempotency: the same key and body is the same run; another
    // previous run under that key is a conflict.
    let keyed = |previous: &str| {
        server.send(
            server
                .request("POST", RUNS)
                .bearer_auth(&key)
                .header("idempotency-key", "follow-up-1")
                .json(&json!({"input": "follow up", "previous_run_id": previous})),
        )
    };
    let made = keyed(&first_id).expect_status(201).clone();
    let replay = keyed(&first_id);
    assert_eq!((replay.status, replay.header("idempotent-replayed")), (201, Some("true")));
    assert_eq!(replay.body["id"], made["id"]);
    keyed(&second_id).expect_error(409, "conflict");

    // The command line continues a run and lists its thread.
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(support::BIN)
            .args(args)
            .env("AGENT_RUNS_URL", &server.base)
            .env("AGENT_RUNS_KEY", &key)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let continued = cli(&["runs", "continue", &second_id, "--input", "from the shell"]);
    assert!(continued.contains(&format!("{second_id} (thread {first_id})")), "{continued}");
    let listed = cli(&["runs", "list", "--thread", &first_id]);
    assert_eq!(listed.lines().filter(|line| line.starts_with("run_")).count(), 6, "{listed}");
    assert!(listed.lines().last().unwrap().starts_with(&first_id), "the first run last: {listed}");
}

pub(super) fn a_defined_agent_is_asked_a_follow_up_and_the_oldest_turn_makes_room(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(stand_in::StandIn::start());
    model.script(vec![
        stand_in::text("Three stale branches."),
        stand_in::text("Deleted them."),
        stand_in::text("Done."),
    ]);
    let server =
        Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0"), ("AGENT_RUNS_MAX_CHECKPOINT_BYTES", "1500")]);
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    std::fs::write(&file, support::janitor_definition(&model.url, "")).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);

    let first =
        server.create(&key, json!({"agent": "janitor", "input": format!("Find stale branches {}", "a".repeat(500))}));
    let first_id = first["id"].as_str().unwrap();
    server.wait_for_status(&key, first_id, "succeeded");
    let second =
        server.create(&key, json!({"input": format!("Delete them {}", "b".repeat(500)), "previous_run_id": first_id}));
    assert_eq!(second["agent"], "janitor");
    let second_id = second["id"].as_str().unwrap();
    assert_eq!(server.wait_for_status(&key, second_id, "succeeded")["output"], "Deleted them.");
    let asked = &model.model_requests()[1]["messages"];
    let texts: Vec<&str> =
        asked.as_array().unwrap().iter().map(|message| message["content"].as_str().unwrap_or("")).collect();
    assert_eq!(texts.len(), 4, "{asked}");
    assert!(texts[1].starts_with("Find stale branches") && texts[3].starts_with("Delete them"), "{asked}");
    assert_eq!(texts[2], "Three stale branches.");

    // A third input does not fit beside both earlier turns: the oldest goes.
    let third = server
        .create(&key, json!({"input": format!("Anything else? {}", "c".repeat(500)), "previous_run_id": second_id}));
    let third_id = third["id"].as_str().unwrap();
    server.wait_for_status(&key, third_id, "succeeded");
    let asked = &model.model_requests()[2]["messages"];
    let inputs: Vec<&str> = asked
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "user")
        .map(|message| message["content"].as_str().unwrap().split(' ').next().unwrap())
        .collect();
    assert_eq!(inputs, ["Delete", "Anything"], "{asked}");
    let events = server.get(&key, &format!("{RUNS}/{third_id}/events")).expect_status(200).clone();
    let truncated: Vec<&Value> =
        events["data"].as_array().unwrap().iter().filter(|event| event["type"] == "context.truncated").collect();
    assert_eq!(truncated.len(), 1, "{events}");
    assert_eq!(truncated[0]["data"]["dropped_turns"], 1);
    assert!(truncated[0]["data"]["dropped_bytes"].as_u64().unwrap() > 500, "{}", truncated[0]);
    assert!(!events.to_string().contains("dropped_turns\":0"));
}
