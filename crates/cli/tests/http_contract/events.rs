//! Cancels in every state, and a run's events: pages, parameters, the event stream.

use super::*;

// ---------------------------------------------------------------- cancel

pub(super) fn cancel_in_every_state(target: Target) {
    // One worker, kept busy, so a second run stays queued.
    let server = Server::start_on(target, &[("AGENT_RUNS_WORKERS", "1")]);
    let key = server.dev_key.clone().unwrap();
    let running = server.create_script(&key, "say started\nsleep 60000\nsay never");
    let running = server.wait_for_status(&key, running["id"].as_str().unwrap(), "running");
    let queued = server.create(&key, json!({"input": "waits"}));

    let canceled = server.post(&key, &format!("{}/cancel", run_path(&queued)), json!({})).expect_status(200).clone();
    assert_eq!(canceled["status"], "canceled");
    assert!(is_timestamp(&canceled["completed_at"]));
    assert_eq!(canceled["started_at"], Value::Null);

    // Cancel a running run with an empty body; the worker stops and never overwrites it.
    let reply = server.send(server.request("POST", &format!("{}/cancel", run_path(&running))).bearer_auth(&key));
    let canceled_running = reply.expect_status(200).clone();
    assert_eq!(canceled_running["status"], "canceled");
    assert!(is_timestamp(&canceled_running["started_at"]));

    // Cancel one awaiting approval: its pending approval becomes canceled.
    let waiting = server.create_script(&key, "approve Deploy");
    let waiting = server.wait_for_status(&key, waiting["id"].as_str().unwrap(), "awaiting_approval");
    let canceled_waiting =
        server.post(&key, &format!("{}/cancel", run_path(&waiting)), json!({})).expect_status(200).clone();
    assert_eq!(canceled_waiting["status"], "canceled");
    let approval = &canceled_waiting["pending_approvals"][0];
    assert_eq!(approval["status"], "canceled");
    assert!(is_timestamp(&approval["resolved_at"]));
    // A decision on a canceled approval is a conflict.
    let decide = format!("{}/approvals/{}", run_path(&waiting), approval["id"].as_str().unwrap());
    server.post(&key, &decide, json!({"decision": "approve"})).expect_error(409, "conflict");

    // Canceling again answers 200 with the run unchanged.
    let again = server.post(&key, &format!("{}/cancel", run_path(&queued)), json!({})).expect_status(200).clone();
    assert_eq!(again, canceled);

    // Succeeded and failed runs cannot be canceled.
    let done = server.create(&key, json!({"input": "x"}));
    let failed = server.create_script(&key, "fail broken");
    server.wait_for_status(&key, done["id"].as_str().unwrap(), "succeeded");
    server.wait_for_status(&key, failed["id"].as_str().unwrap(), "failed");
    for run in [&done, &failed] {
        server.post(&key, &format!("{}/cancel", run_path(run)), json!({})).expect_error(409, "conflict");
    }

    // The canceled worker's run stays canceled with no output.
    std::thread::sleep(Duration::from_millis(600));
    let after = server.get(&key, &run_path(&running)).expect_status(200).clone();
    assert_eq!(after, canceled_running);
    assert_eq!(after["output"], Value::Null);
    // The queued run never ran.
    let after = server.get(&key, &run_path(&queued)).expect_status(200).clone();
    assert_eq!(after, canceled);

    server.post(&key, &format!("{RUNS}/{UNKNOWN_RUN}/cancel"), json!({})).expect_error(404, "not_found");
    server.post(&key, &format!("{RUNS}/nope/cancel"), json!({})).expect_error(404, "not_found");
    let error = server
        .post(&key, &format!("{}/cancel", run_path(&done)), json!({"force": true}))
        .expect_error(400, "invalid_request")
        .clone();
    assert_eq!(error["param"], "force");
}

// ---------------------------------------------------------------- run events

pub(super) fn event_types(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap().to_owned()).collect()
}

pub(super) fn events_tell_what_happened_to_a_run_in_order(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "say hello\napprove Ship it\nsay done");
    let id = run["id"].as_str().unwrap();
    let run = server.wait_for_status(&key, id, "awaiting_approval");
    let events = format!("{}/events", run_path(&run));
    let page = server.get(&key, &events).expect_status(200).clone();
    assert_eq!(
        event_types(&page),
        ["run.created", "run.started", "output.appended", "approval.requested", "run.awaiting_approval"]
    );
    assert_eq!((page["next_after"].as_u64(), page["has_more"].as_bool()), (Some(5), Some(false)));
    let approval_id = run["pending_approvals"][0]["id"].clone();
    assert_eq!(page["data"][3]["data"]["id"], approval_id);
    assert_eq!(page["data"][4]["data"]["approval_ids"], json!([approval_id]));
    for (index, event) in page["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(event["seq"].as_u64(), Some(index as u64 + 1));
        assert_eq!(event["run_id"].as_str(), Some(id));
        assert!(event["id"].as_str().unwrap().starts_with("evt_") && is_timestamp(&event["created_at"]), "{event}");
    }

    // Someone waits for what comes next; a decision wakes them.
    let waiting = {
        let url = format!("{}{events}?after=5&wait=15", server.base);
        let (client, key) = (support::http_client().build().unwrap(), key.clone());
        std::thread::spawn(move || client.get(url).bearer_auth(key).send().unwrap().json::<Value>().unwrap())
    };
    std::thread::sleep(Duration::from_millis(300));
    let decision = format!("{}/approvals/{}", run_path(&run), approval_id.as_str().unwrap());
    server.post(&key, &decision, json!({"decision": "approve", "comment": "go"})).expect_status(200);
    let woken = waiting.join().unwrap();
    assert_eq!(event_types(&woken).first().map(String::as_str), Some("approval.decided"), "{woken}");
    assert_eq!(woken["data"][0]["data"]["status"], "approved");
    assert_eq!(woken["data"][0]["data"]["comment"], "go");
    assert_eq!(woken["data"][0]["data"]["decision"], "approve");

    let done = server.wait_for_status(&key, id, "succeeded");
    let rest = server.get(&key, &format!("{events}?after=5&limit=3")).expect_status(200).clone();
    assert_eq!(event_types(&rest), ["approval.decided", "run.resumed", "run.started"]);
    assert_eq!((rest["next_after"].as_u64(), rest["has_more"].as_bool()), (Some(8), Some(true)));
    let end = server.get(&key, &format!("{events}?after=8&wait=20")).expect_status(200).clone();
    assert_eq!(event_types(&end), ["output.appended", "output.appended", "run.succeeded"]);
    assert_eq!(end["data"][0]["data"]["text"], "approved: Ship it");
    assert_eq!(end["data"][2]["data"], done, "the terminal event shows the run as it ended");
    // Nothing comes after the end: a wait is answered at once, empty.
    let started = std::time::Instant::now();
    let after_end = server.get(&key, &format!("{events}?after=11&wait=20")).expect_status(200).clone();
    assert_eq!((after_end["data"].as_array().unwrap().len(), after_end["next_after"].as_u64()), (0, Some(11)));
    assert!(started.elapsed() < Duration::from_secs(10));
    // As for every operation, another owner's run does not exist.
    let other = server.key("someone-else");
    server.get(&other, &events).expect_error(404, "not_found");
}

pub(super) fn events_parameters_are_checked_strictly(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create(&key, json!({"input": "hi"}));
    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    let events = format!("{}/events", run_path(&done));
    let all = server.get(&key, &events).expect_status(200).clone();
    assert_eq!(event_types(&all), ["run.created", "run.started", "run.succeeded"]);
    // One past the end is the end; beyond it, an error.
    assert_eq!(server.get(&key, &format!("{events}?after=4")).expect_status(200)["data"], json!([]));
    for (query, param) in [
        ("after=5", "after"),
        ("after=-1", "after"),
        ("after=1e3", "after"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("wait=21", "wait"),
        ("wait=1.5", "wait"),
        ("after=1&after=2", "after"),
        ("cursor=x", "cursor"),
    ] {
        let error = server.get(&key, &format!("{events}?{query}")).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param, "{query}");
    }
    assert_eq!(
        event_types(server.get(&key, &format!("{events}?after=&limit=&wait=")).expect_status(200)),
        event_types(&all)
    );
    server.get(&key, &format!("{RUNS}/{UNKNOWN_RUN}/events")).expect_error(404, "not_found");
    server.get(&key, &format!("{RUNS}/nope/events")).expect_error(404, "not_found");
    server.post(&key, &events, json!({})).expect_error(405, "method_not_allowed");
}

/// `id`, `event` and `data` of each message of a Server-Sent Events body.
pub(super) fn sse_messages(body: &str) -> Vec<(u64, String, Value)> {
    body.split("\n\n")
        .filter(|message| !message.trim().is_empty() && !message.starts_with(':'))
        .map(|message| {
            let field = |name: &str| {
                message
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .unwrap_or_else(|| panic!("{name} in {message}"))
            };
            (
                field("id: ").parse().unwrap(),
                field("event: ").to_owned(),
                serde_json::from_str(field("data: ")).unwrap(),
            )
        })
        .collect()
}

/// The embedded server streams a run's events as they are committed, ends
/// the stream after the run's last one, and resumes after `Last-Event-ID`.
#[test]
pub(super) fn the_embedded_server_streams_events_as_server_sent_events() {
    let server = Server::start_on(Target::Embedded, &[]);
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "say a\nsleep 300\nsay b");
    let events = format!("{}{}/events", server.base, run_path(&run));
    let client = support::http_client().timeout(Duration::from_secs(60)).build().unwrap();
    let response = client.get(&events).bearer_auth(&key).header("accept", "text/event-stream").send().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["cache-control"], "no-cache");
    assert!(response.headers().contains_key("x-request-id"));
    // The body ends: the stream closes after the terminal event.
    let messages = sse_messages(&response.text().unwrap());
    let kinds: Vec<&str> = messages.iter().map(|(_, kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["run.created", "run.started", "output.appended", "output.appended", "run.succeeded"]);
    for (index, (id, kind, event)) in messages.iter().enumerate() {
        assert_eq!((*id, event["seq"].as_u64()), (index as u64 + 1, Some(index as u64 + 1)));
        assert_eq!(event["type"].as_str(), Some(kind.as_str()));
    }
    assert_eq!(messages[4].2["data"]["output"], "a\nb");

    let resumed = client
        .get(&events)
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .header("last-event-id", "3")
        .send()
        .unwrap()
        .text()
        .unwrap();
    let ids: Vec<u64> = sse_messages(&resumed).iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, [4, 5], "resumed after Last-Event-ID");
    // The run has ended and the client has seen it all: 204 tells an
    // EventSource not to reconnect.
    let over = client
        .get(&events)
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .header("last-event-id", "5")
        .send()
        .unwrap();
    assert_eq!(over.status(), 204);
    let refused = client
        .get(&events)
        .bearer_auth(&key)
        .header("accept", "text/event-stream")
        .header("last-event-id", "x")
        .send()
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(refused.headers()["content-type"], "application/json");
}
