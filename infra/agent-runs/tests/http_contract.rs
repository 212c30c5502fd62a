//! The wire contract (shared/CONTRACT.md), rule by rule, against the real
//! `agent-runs serve` binary over HTTP.

#[path = "../../../shared/tests/support/stand_in.rs"]
mod stand_in;
mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, Target, is_timestamp};

const RUNS: &str = "/v1/agent/runs";
const UNKNOWN_RUN: &str = "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9";

fn run_path(run: &Value) -> String {
    format!("{RUNS}/{}", run["id"].as_str().unwrap())
}

fn ids(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|run| run["id"].as_str().unwrap().to_owned()).collect()
}

// ---------------------------------------------------------------- auth

fn missing_malformed_unknown_and_revoked_keys_answer_401_with_www_authenticate(target: Target) {
    // Verified keys are cached; revocation must still take effect (here within the 1 s cache).
    let server = Server::start_on(target, &[("AGENT_RUNS_KEY_CACHE_SECS", "1")]);
    let key = server.dev_key.clone().expect("the first start issues a key");
    let unknown = format!("ark_{}", "A".repeat(43));
    let cases = vec![
        ("no header", server.request("GET", RUNS)),
        ("wrong scheme", server.request("GET", RUNS).header("authorization", format!("Basic {key}"))),
        ("no scheme", server.request("GET", RUNS).header("authorization", key.clone())),
        ("empty bearer", server.request("GET", RUNS).header("authorization", "Bearer ")),
        ("malformed key", server.request("GET", RUNS).bearer_auth("ark_tooshort")),
        ("unknown key", server.request("GET", RUNS).bearer_auth(&unknown)),
        ("key in query string", server.request("GET", &format!("{RUNS}?api_key={key}"))),
        ("unknown path", server.request("GET", "/nope")),
        ("create without key", server.request("POST", RUNS).json(&json!({"input": "x"}))),
    ];
    for (what, request) in cases {
        let reply = server.send(request);
        reply.expect_error(401, "unauthorized");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"), "{what}");
    }

    // A key used, then revoked with the admin tool, stops working.
    let other = server.key("acme");
    server.get(&other, RUNS).expect_status(200);
    let listing = server.admin(&["keys", "list"]);
    let key_id = listing.lines().find(|line| line.contains("acme")).unwrap().split_whitespace().next().unwrap();
    server.admin(&["keys", "revoke", key_id]);
    assert!(server.admin(&["keys", "list"]).lines().any(|line| line.contains(key_id) && line.contains("revoked")));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.get(&other, RUNS).status == 200 {
        assert!(std::time::Instant::now() < deadline, "a revoked key kept working");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.get(&other, RUNS).expect_error(401, "unauthorized");
    server.get(&key, RUNS).expect_status(200);
}

fn the_bearer_scheme_is_case_insensitive(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let reply = server.send(server.request("GET", RUNS).header("authorization", format!("{scheme} {key}")));
        reply.expect_status(200);
    }
}

fn another_owners_run_is_indistinguishable_from_a_missing_one(target: Target) {
    let server = Server::start_on(target, &[]);
    let alice = server.key("alice");
    let bob = server.key("bob");
    let run = server.create_script(&alice, "approve Ship it");
    let path = run_path(&run);
    let run = server.wait_for_status(&alice, run["id"].as_str().unwrap(), "awaiting_approval");
    let approval = run["pending_approvals"][0]["id"].as_str().unwrap();

    let missing = server.get(&bob, &format!("{RUNS}/{UNKNOWN_RUN}"));
    let foreign = server.get(&bob, &path);
    foreign.expect_error(404, "not_found");
    assert_eq!(foreign.body, missing.body, "same answer as a run that does not exist");
    server.post(&bob, &format!("{path}/cancel"), json!({})).expect_error(404, "not_found");
    server
        .post(&bob, &format!("{path}/approvals/{approval}"), json!({"decision": "approve"}))
        .expect_error(404, "not_found");
    assert!(ids(&server.get(&bob, RUNS).body).is_empty(), "lists show only the owner's runs");
    // Bob's attempts changed nothing.
    let run = server.get(&alice, &path).expect_status(200).clone();
    assert_eq!(run["status"], "awaiting_approval");
    assert_eq!(run["pending_approvals"][0]["status"], "pending");
}

// ---------------------------------------------------------------- create

fn create_answers_201_with_location_and_a_queued_run(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let reply =
        server.post(&key, RUNS, json!({"input": "Summarise the release notes", "metadata": {"ticket": "OPS-42"}}));
    let run = reply.expect_status(201);
    let id = run["id"].as_str().unwrap();
    assert_eq!(reply.header("location"), Some(format!("{RUNS}/{id}").as_str()));
    assert!(id.starts_with("run_") && id.len() == 30);
    assert_eq!(run["status"], "queued");
    assert_eq!(run["agent"], "echo", "the default agent");
    assert_eq!(run["input"], "Summarise the release notes");
    assert_eq!(run["metadata"], json!({"ticket": "OPS-42"}));
    assert_eq!(run["pending_approvals"], json!([]));
    for key in ["output", "error", "started_at", "completed_at"] {
        assert_eq!(run[key], Value::Null, "{key}");
    }
    let keys: HashSet<&str> = run.as_object().unwrap().keys().map(String::as_str).collect();
    let expected: HashSet<&str> = [
        "id",
        "status",
        "agent",
        "input",
        "output",
        "error",
        "pending_approvals",
        "metadata",
        "created_by",
        "created_at",
        "started_at",
        "completed_at",
    ]
    .into();
    assert_eq!(keys, expected, "every key is always present");
    assert!(is_timestamp(&run["created_at"]), "{}", run["created_at"]);
    assert!(reply.header("idempotent-replayed").is_none());

    // created_at is the time inside the ULID.
    let ulid = &id[4..];
    let alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let millis = ulid[..10].chars().fold(0u64, |acc, c| acc * 32 + alphabet.find(c).unwrap() as u64);
    let created = chrono_like_millis(run["created_at"].as_str().unwrap());
    assert_eq!(millis, created);

    let done = server.wait_for_status(&key, id, "succeeded");
    assert_eq!(done["output"], "Summarise the release notes");
    assert!(is_timestamp(&done["started_at"]) && is_timestamp(&done["completed_at"]));
    assert!(done["completed_at"].as_str() >= done["created_at"].as_str());
    assert_eq!(done["metadata"], json!({"ticket": "OPS-42"}));
}

/// Milliseconds since the epoch of `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn chrono_like_millis(text: &str) -> u64 {
    let n = |range: std::ops::Range<usize>| text[range].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + n(11..13) * 3_600 + n(14..16) * 60 + n(17..19);
    (seconds * 1_000 + n(20..23)) as u64
}

fn create_validates_every_field_and_names_the_offender(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let long = |n: usize| "x".repeat(n);
    let metadata_keys = |n: usize| Value::Object((0..n).map(|i| (format!("k{i}"), json!("v"))).collect());
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({}), Some("input")),
        (json!({"input": ""}), Some("input")),
        (json!({"input": 42}), Some("input")),
        (json!({"input": null}), Some("input")),
        (json!({"input": ["a"]}), Some("input")),
        (json!({"input": long(65_537)}), Some("input")),
        (json!({"input": "x", "agent": 7}), Some("agent")),
        (json!({"input": "x", "agent": "nope"}), Some("agent")),
        (json!({"input": "x", "agent": ""}), Some("agent")),
        (json!({"input": "x", "extra": 1}), Some("extra")),
        (json!({"input": "x", "metadata": "m"}), Some("metadata")),
        (json!({"input": "x", "metadata": ["m"]}), Some("metadata")),
        (json!({"input": "x", "metadata": {"k": 1}}), Some("metadata")),
        (json!({"input": "x", "metadata": {"k": null}}), Some("metadata")),
        (json!({"input": "x", "metadata": metadata_keys(17)}), Some("metadata")),
        (json!({"input": "x", "metadata": {long(65): "v"}}), Some("metadata")),
        (json!({"input": "x", "metadata": {"": "v"}}), Some("metadata")),
        (json!({"input": "x", "metadata": {"k": long(513)}}), Some("metadata")),
        (json!({"input": "shout hi", "agent": "script"}), Some("input")),
        (json!({"input": "sleep 60001", "agent": "script"}), Some("input")),
        (json!(["input"]), None),
        (json!("input"), None),
    ];
    for (body, param) in cases {
        let reply = server.post(&key, RUNS, body.clone());
        let error = reply.expect_error(400, "invalid_request");
        assert_eq!(error["param"].as_str(), param, "body {body}: {error}");
    }
    let repeated_names = [r#"{"input": "x", "input": "y"}"#, r#"{"input": "x", "metadata": {"k": "a", "k": "b"}}"#];
    for raw in ["{", "{\"input\": \"x\",}", "", "nul", "{\"input\": \"x\"} trailing"].into_iter().chain(repeated_names)
    {
        let reply = server
            .send(server.request("POST", RUNS).bearer_auth(&key).header("content-type", "application/json").body(raw));
        reply.expect_error(400, "invalid_request");
    }
    // Bounds that are allowed.
    let accepted = [
        json!({"input": long(65_536)}),
        json!({"input": "é".repeat(32_768)}),
        json!({"input": "x", "metadata": metadata_keys(16)}),
        json!({"input": "x", "metadata": {long(64): long(512)}}),
        json!({"input": "x", "metadata": {"k": ""}}),
        json!({"input": "x", "agent": "echo", "metadata": {}}),
        json!({"input": "say hi\nsleep 60000", "agent": "script"}),
    ];
    for body in accepted {
        server.post(&key, RUNS, body).expect_status(201);
    }
    assert_eq!(ids(&server.get(&key, &format!("{RUNS}?limit=100")).body).len(), 7, "nothing else was created");
}

fn bodies_over_256_kib_answer_413_and_other_media_types_415(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let big = format!("{{\"input\": \"{}\"}}", "x".repeat(256 * 1024));
    let reply = server
        .send(server.request("POST", RUNS).bearer_auth(&key).header("content-type", "application/json").body(big));
    reply.expect_error(413, "request_too_large");
    let just_fits = format!("{{\"input\": \"x\", \"metadata\": {{}}}}{}", " ".repeat(256 * 1024 - 30));
    assert_eq!(just_fits.len(), 256 * 1024);
    let reply = server.send(
        server.request("POST", RUNS).bearer_auth(&key).header("content-type", "application/json").body(just_fits),
    );
    reply.expect_status(201);

    for content_type in [Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("application/jsonx"), None]
    {
        let mut request = server.request("POST", RUNS).bearer_auth(&key).body(r#"{"input": "x"}"#);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        server.send(request).expect_error(415, "unsupported_media_type");
    }
    for content_type in ["application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8"] {
        let request = server
            .request("POST", RUNS)
            .bearer_auth(&key)
            .header("content-type", content_type)
            .body(r#"{"input": "x"}"#);
        server.send(request).expect_status(201);
    }
}

// ---------------------------------------------------------------- idempotency

fn an_idempotency_key_replays_the_original_run_and_refuses_a_different_body(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let other_owner = server.key("other");
    let create = |api_key: &str, idem: &str, body: Value| {
        server.send(server.request("POST", RUNS).bearer_auth(api_key).header("idempotency-key", idem).json(&body))
    };
    let first = create(&key, "order-42", json!({"input": "hello", "metadata": {"a": "1", "b": "2"}}));
    first.expect_status(201);
    assert!(first.header("idempotent-replayed").is_none());
    let id = first.body["id"].clone();

    // Same body (other formatting and key order): the original run, not a new one.
    let again = server.send(
        server
            .request("POST", RUNS)
            .bearer_auth(&key)
            .header("idempotency-key", "order-42")
            .header("content-type", "application/json")
            .body(r#"{ "metadata": {"b": "2", "a": "1"},   "input": "hello" }"#),
    );
    again.expect_status(201);
    assert_eq!(again.body["id"], id);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("location"), first.header("location"));

    create(&key, "order-42", json!({"input": "goodbye"})).expect_error(409, "conflict");
    // Keys are per owner.
    let theirs = create(&other_owner, "order-42", json!({"input": "hello"}));
    theirs.expect_status(201);
    assert_ne!(theirs.body["id"], id);
    assert_eq!(ids(&server.get(&key, RUNS).body).len(), 1, "no second run was made");

    for bad in ["x".repeat(256), String::new(), "tab\tchar".into()] {
        let reply = create(&key, &bad, json!({"input": "hello"}));
        let error = reply.expect_error(400, "invalid_request");
        assert_eq!(error["param"], "Idempotency-Key");
    }
    create(&key, &"k".repeat(255), json!({"input": "hello"})).expect_status(201);
}

// ---------------------------------------------------------------- list

fn list_pages_newest_first_without_repeats_or_gaps(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let mut created: Vec<String> = (0..25)
        .map(|i| server.create(&key, json!({"input": format!("run {i}")}))["id"].as_str().unwrap().to_owned())
        .collect();
    created.reverse();

    let first = server.get(&key, RUNS).expect_status(200).clone();
    assert_eq!(ids(&first), created[..20], "default limit 20, newest first");

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => format!("{RUNS}?limit=10"),
            Some(cursor) => format!("{RUNS}?limit=10&cursor={cursor}"),
        };
        let page = server.get(&key, &path).expect_status(200).clone();
        pages += 1;
        if pages == 1 {
            // Runs created after the first page do not shift later pages.
            for i in 0..3 {
                server.create(&key, json!({"input": format!("late {i}")}));
            }
        }
        seen.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, created);

    // An exact multiple: the last full page has no cursor (never an empty page after it).
    let page = server.get(&key, &format!("{RUNS}?limit=28")).expect_status(200).clone();
    assert_eq!(ids(&page).len(), 28);
    assert_eq!(page["next_cursor"], Value::Null);
    let page = server.get(&key, &format!("{RUNS}?limit=27")).expect_status(200).clone();
    let next = page["next_cursor"].as_str().unwrap();
    let last = server.get(&key, &format!("{RUNS}?limit=27&cursor={next}")).expect_status(200).clone();
    assert_eq!(ids(&last).len(), 1);
    assert_eq!(last["next_cursor"], Value::Null);
    // Every run has the full shape in lists too.
    assert!(page["data"].as_array().unwrap().iter().all(|run| run.as_object().unwrap().len() == 12));
}

fn list_filters_by_status_and_binds_the_cursor_to_the_filter(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    let waiting: Vec<String> =
        (0..3).map(|_| server.create_script(&key, "approve Go")["id"].as_str().unwrap().to_owned()).collect();
    let echo = server.create(&key, json!({"input": "x"}));
    for id in &waiting {
        server.wait_for_status(&key, id, "awaiting_approval");
    }
    server.wait_for_status(&key, echo["id"].as_str().unwrap(), "succeeded");

    let page = server.get(&key, &format!("{RUNS}?status=awaiting_approval&limit=2")).expect_status(200).clone();
    assert_eq!(ids(&page), vec![waiting[2].clone(), waiting[1].clone()]);
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let rest = server
        .get(&key, &format!("{RUNS}?status=awaiting_approval&limit=2&cursor={cursor}"))
        .expect_status(200)
        .clone();
    assert_eq!(ids(&rest), vec![waiting[0].clone()]);
    assert_eq!(rest["next_cursor"], Value::Null);

    let succeeded = server.get(&key, &format!("{RUNS}?status=succeeded")).expect_status(200).clone();
    assert_eq!(ids(&succeeded), vec![echo["id"].as_str().unwrap().to_owned()]);
    assert!(ids(&server.get(&key, &format!("{RUNS}?status=canceled")).body).is_empty());

    // The cursor is bound to its filter, and to being unaltered.
    for path in [
        format!("{RUNS}?cursor={cursor}"),
        format!("{RUNS}?status=queued&cursor={cursor}"),
        format!("{RUNS}?status=awaiting_approval&cursor={}", &cursor[..cursor.len() - 2]),
        format!("{RUNS}?status=awaiting_approval&cursor={}A", cursor),
        format!("{RUNS}?status=awaiting_approval&cursor=not-a-cursor"),
        format!("{RUNS}?status=awaiting_approval&cursor={}", flip_one(&cursor)),
    ] {
        let error = server.get(&key, &path).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], "cursor", "{path}");
    }
    // Another owner cannot use the cursor either.
    let other = server.key("other");
    server
        .get(&other, &format!("{RUNS}?status=awaiting_approval&cursor={cursor}"))
        .expect_error(400, "invalid_request");
}

fn flip_one(text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let i = bytes.len() / 2;
    bytes[i] = if bytes[i] == b'x' { b'y' } else { b'x' };
    String::from_utf8(bytes).unwrap()
}

fn list_parameters_are_checked_strictly(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for i in 0..3 {
        server.create(&key, json!({"input": format!("{i}")}));
    }
    let bad: Vec<(&str, &str)> = vec![
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=-1", "limit"),
        ("limit=abc", "limit"),
        ("limit=1.5", "limit"),
        ("limit=+5", "limit"),
        ("limit=99999999999999999999", "limit"),
        ("status=done", "status"),
        ("status=QUEUED", "status"),
        ("colour=red", "colour"),
        ("limit=5&limit=6", "limit"),
        ("status=queued&status=queued", "status"),
        ("cursor=a&cursor=b", "cursor"),
    ];
    for (query, param) in bad {
        let error = server.get(&key, &format!("{RUNS}?{query}")).expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param, "{query}");
    }
    let good = ["limit=1", "limit=100", "limit=", "status=", "cursor=", "limit=&status=&cursor=", ""];
    for query in good {
        server.get(&key, &format!("{RUNS}?{query}")).expect_status(200);
    }
    assert_eq!(ids(&server.get(&key, &format!("{RUNS}?limit=1")).body).len(), 1);
    assert_eq!(ids(&server.get(&key, &format!("{RUNS}?limit=")).body).len(), 3);
}

fn a_created_run_is_in_the_next_list_and_get(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for i in 0..20 {
        let run = server.create(&key, json!({"input": format!("{i}")}));
        let listed = ids(&server.get(&key, &format!("{RUNS}?limit=1")).body);
        assert_eq!(listed, vec![run["id"].as_str().unwrap().to_owned()]);
        server.get(&key, &run_path(&run)).expect_status(200);
    }
}

// ---------------------------------------------------------------- get and routing

fn get_answers_404_for_unknown_and_malformed_ids(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for id in [UNKNOWN_RUN, "run_123", "nope", "run_01jdq3v7q4k8z2x9m5n6p7r8s9", "apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9"] {
        server.get(&key, &format!("{RUNS}/{id}")).expect_error(404, "not_found");
    }
}

fn unknown_paths_answer_404_and_other_methods_405_with_allow(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for path in ["/", "/v1", "/v1/agent", "/v2/agent/runs", "/v1/agent/runs/x/y", "/v1/agent/runs/x/approvals"] {
        server.get(&key, path).expect_error(404, "not_found");
    }
    let cases = [
        ("DELETE", RUNS.to_owned(), "GET, POST"),
        ("PUT", RUNS.to_owned(), "GET, POST"),
        ("POST", format!("{RUNS}/{UNKNOWN_RUN}"), "GET"),
        ("DELETE", format!("{RUNS}/{UNKNOWN_RUN}"), "GET"),
        ("GET", format!("{RUNS}/{UNKNOWN_RUN}/cancel"), "POST"),
        ("GET", format!("{RUNS}/{UNKNOWN_RUN}/approvals/apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9"), "POST"),
    ];
    for (method, path, allow) in cases {
        let reply = server.send(server.request(method, &path).bearer_auth(&key));
        reply.expect_error(405, "method_not_allowed");
        assert_eq!(reply.header("allow"), Some(allow), "{method} {path}");
    }
}

// ---------------------------------------------------------------- cancel

fn cancel_in_every_state(target: Target) {
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

fn event_types(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap().to_owned()).collect()
}

fn events_tell_what_happened_to_a_run_in_order(target: Target) {
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

fn events_parameters_are_checked_strictly(target: Target) {
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
fn sse_messages(body: &str) -> Vec<(u64, String, Value)> {
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
fn the_embedded_server_streams_events_as_server_sent_events() {
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

// ---------------------------------------------------------------- scopes

/// The id of a key, from a run it created.
fn key_id_of(server: &Server, key: &str) -> Value {
    let run = server.create(key, json!({"input": "who am I"}));
    run["created_by"].clone()
}

/// The id of the key named `name` (`agent-runs keys list`).
fn key_id(server: &Server, name: &str) -> String {
    let listed = server.admin(&["keys", "list"]);
    let line = listed.lines().find(|line| line.trim_end().ends_with(&format!("  {name}"))).expect("the key is listed");
    line.split_whitespace().next().unwrap().to_owned()
}

fn scopes_limit_what_a_key_may_do_and_decisions_name_their_key(target: Target) {
    let server = Server::start_on(target, &[]);
    let scoped = |name: &str, scopes: &[&str]| {
        let mut args = vec!["keys", "create", "--owner", "dev", "--name", name];
        for scope in scopes {
            args.extend(["--scope", scope]);
        }
        server.admin(&args).trim().to_owned()
    };
    let reader = scoped("reader", &["runs:read"]);
    let writer = scoped("writer", &["runs:write"]);
    let approver = scoped("approver", &["approvals:decide"]);

    let run = server.create_script(&writer, "approve Ship it");
    assert_eq!(run["created_by"].as_str(), Some(key_id(&server, "writer").as_str()), "the run names its creator");
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

fn approve_resumes_the_script_and_repeats_are_safe(target: Target) {
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

fn reject_lets_the_script_go_on(target: Target) {
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

fn decide_validates_its_body_and_ids(target: Target) {
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

fn the_inbox_lists_approvals_across_runs_newest_first(target: Target) {
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

fn a_batch_decides_across_runs_all_or_nothing(target: Target) {
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

fn the_script_agent_says_sleeps_and_fails(target: Target) {
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

fn too_many_active_runs_answer_429_with_retry_after(target: Target) {
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

fn requests_over_the_rate_limit_answer_429_with_retry_after(target: Target) {
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

fn a_defined_agent_is_managed_with_the_cli_and_waits_for_approval(target: Target) {
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

/// Every rule above, against every way of serving.
macro_rules! on_every_target {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test] fn $name() { super::$name(super::Target::Embedded) })*
        }
        mod lambda {
            $(#[test] fn $name() {
                if crate::support::without_emulator(concat!("lambda::", stringify!($name))) {
                    return;
                }
                super::$name(super::Target::Lambda)
            })*
        }
    };
}

on_every_target!(
    missing_malformed_unknown_and_revoked_keys_answer_401_with_www_authenticate,
    the_bearer_scheme_is_case_insensitive,
    another_owners_run_is_indistinguishable_from_a_missing_one,
    create_answers_201_with_location_and_a_queued_run,
    create_validates_every_field_and_names_the_offender,
    bodies_over_256_kib_answer_413_and_other_media_types_415,
    an_idempotency_key_replays_the_original_run_and_refuses_a_different_body,
    list_pages_newest_first_without_repeats_or_gaps,
    list_filters_by_status_and_binds_the_cursor_to_the_filter,
    list_parameters_are_checked_strictly,
    a_created_run_is_in_the_next_list_and_get,
    get_answers_404_for_unknown_and_malformed_ids,
    unknown_paths_answer_404_and_other_methods_405_with_allow,
    cancel_in_every_state,
    approve_resumes_the_script_and_repeats_are_safe,
    reject_lets_the_script_go_on,
    decide_validates_its_body_and_ids,
    the_script_agent_says_sleeps_and_fails,
    too_many_active_runs_answer_429_with_retry_after,
    requests_over_the_rate_limit_answer_429_with_retry_after,
    a_defined_agent_is_managed_with_the_cli_and_waits_for_approval,
    events_tell_what_happened_to_a_run_in_order,
    events_parameters_are_checked_strictly,
    scopes_limit_what_a_key_may_do_and_decisions_name_their_key,
    the_inbox_lists_approvals_across_runs_newest_first,
    a_batch_decides_across_runs_all_or_nothing,
);
