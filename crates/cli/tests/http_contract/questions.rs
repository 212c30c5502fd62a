//! Questions: a script asks, a person answers (held to the schema) or
//! declines; the inbox filters by kind; a defined agent's `ask_human`.

use super::*;

pub(super) fn a_script_asks_and_a_person_answers_or_declines(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "ask Which environment?\nask Ticket number?\nsay done");
    let id = run["id"].as_str().unwrap().to_owned();
    let run = server.wait_for_status(&key, &id, "awaiting_approval");
    let question = &run["pending_approvals"][0];
    assert_eq!((&question["kind"], &question["action"]), (&json!("input"), &json!("Which environment?")));
    assert_eq!((&question["input_schema"], &question["answer"]), (&json!({"type": "string"}), &Value::Null));
    assert_eq!((&question["tool"], &question["arguments"]), (&Value::Null, &Value::Null));
    let path = format!("{}/approvals/{}", run_path(&run), question["id"].as_str().unwrap());

    // The inbox shows questions apart; the cursor is bound to the filter.
    let script_waits = server.create_script(&key, "approve Deploy");
    server.wait_for_status(&key, script_waits["id"].as_str().unwrap(), "awaiting_approval");
    let questions = server.get(&key, "/v1/approvals?kind=input").expect_status(200).clone();
    let kinds: Vec<&str> = questions["data"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["input"]);
    let actions = server.get(&key, "/v1/approvals?kind=action&limit=1").expect_status(200).clone();
    assert_eq!(actions["data"][0]["action"], "Deploy");
    server.get(&key, "/v1/approvals?kind=question").expect_error(400, "invalid_request");

    // What a question refuses changes nothing.
    for (body, param) in [
        (json!({"decision": "approve"}), "decision"),
        (json!({"decision": "edit", "arguments": {}}), "decision"),
        (json!({"decision": "answer"}), "answer"),
        (json!({"decision": "answer", "answer": 42}), "answer"),
        (json!({"decision": "answer", "answer": "x".repeat(9_000)}), "answer"),
        (json!({"decision": "reject", "answer": "prod"}), "answer"),
        (json!({"decision": "answer", "answer": "prod", "arguments": {}}), "arguments"),
    ] {
        let error = server.post(&key, &path, body.clone()).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param, "{body}: {error}");
    }
    let error = server
        .post(&key, &path, json!({"decision": "answer", "answer": 42}))
        .expect_error(400, "invalid_request")
        .clone();
    assert!(error["message"].as_str().unwrap().contains("string"), "{error}");
    assert_eq!(server.get(&key, &run_path(&run)).expect_status(200)["pending_approvals"][0]["status"], "pending");

    let answered =
        server.post(&key, &path, json!({"decision": "answer", "answer": "staging"})).expect_status(200).clone();
    assert_eq!(answered["pending_approvals"][0]["status"], "answered");
    assert_eq!(answered["pending_approvals"][0]["answer"], "staging");
    assert!(is_timestamp(&answered["pending_approvals"][0]["resolved_at"]));
    // The same answer again is 200; another answer or decision is 409.
    server.post(&key, &path, json!({"decision": "answer", "answer": "staging"})).expect_status(200);
    server.post(&key, &path, json!({"decision": "answer", "answer": "prod"})).expect_error(409, "conflict");
    server.post(&key, &path, json!({"decision": "reject"})).expect_error(409, "conflict");
    // An answer on an action is refused.
    let waiting = server.get(&key, &run_path(&script_waits)).expect_status(200).clone();
    let action =
        format!("{}/approvals/{}", run_path(&waiting), waiting["pending_approvals"][0]["id"].as_str().unwrap());
    let error = server
        .post(&key, &action, json!({"decision": "answer", "answer": "x"}))
        .expect_error(400, "invalid_request")
        .clone();
    assert_eq!(error["param"], "decision");

    let run = server.wait_for(&key, &id, Duration::from_secs(20), |run| {
        run["status"] == "awaiting_approval" && run["pending_approvals"].as_array().unwrap().len() == 2
    });
    let second = format!("{}/approvals/{}", run_path(&run), run["pending_approvals"][1]["id"].as_str().unwrap());
    server.post(&key, &second, json!({"decision": "reject", "comment": "not mine to say"})).expect_status(200);
    let done = server.wait_for_status(&key, &id, "succeeded");
    assert_eq!(done["output"], "answered: staging\ndeclined: Ticket number?\ndone");
    let answered = server.get(&key, "/v1/approvals?status=answered&kind=input").expect_status(200).clone();
    assert_eq!(answered["data"][0]["answer"], "staging");

    // The log tells the question and the answer, and ends with the run as
    // it ended, the question's schema and answer included.
    let events = server.get(&key, &format!("{}/events", run_path(&run))).expect_status(200).clone();
    assert_eq!(events["data"].as_array().unwrap().last().unwrap()["data"], done);
    let decided: Vec<&Value> =
        events["data"].as_array().unwrap().iter().filter(|e| e["type"] == "approval.decided").collect();
    assert_eq!(decided[0]["data"]["kind"], "input");
    assert_eq!(decided[0]["data"]["action"], "Which environment?");
    assert_eq!(decided[0]["data"]["answer"], "staging");
    assert_eq!(decided[0]["data"]["decision"], "answer");
    assert_eq!(
        (&decided[1]["data"]["status"], &decided[1]["data"]["decision"]),
        (&json!("rejected"), &json!("reject"))
    );
}
