//! Keys, creates, idempotency, lists and gets, unknown paths.

use super::*;

// ---------------------------------------------------------------- auth

pub(super) fn missing_malformed_unknown_and_revoked_keys_answer_401_with_www_authenticate(target: Target) {
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

pub(super) fn the_bearer_scheme_is_case_insensitive(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let reply = server.send(server.request("GET", RUNS).header("authorization", format!("{scheme} {key}")));
        reply.expect_status(200);
    }
}

pub(super) fn another_owners_run_is_indistinguishable_from_a_missing_one(target: Target) {
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

pub(super) fn create_answers_201_with_location_and_a_queued_run(target: Target) {
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
        "thread_id",
        "previous_run_id",
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
pub(super) fn chrono_like_millis(text: &str) -> u64 {
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

pub(super) fn create_validates_every_field_and_names_the_offender(target: Target) {
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

pub(super) fn bodies_over_256_kib_answer_413_and_other_media_types_415(target: Target) {
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

pub(super) fn an_idempotency_key_replays_the_original_run_and_refuses_a_different_body(target: Target) {
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
    // What the body asks is judged before the header: an unknown agent or a
    // run to continue that does not exist wins over a malformed key.
    let unknown = create(&key, "", json!({"input": "hello", "agent": "nope"}));
    assert_eq!(unknown.expect_error(400, "invalid_request")["param"], "agent");
    let missing = json!({"input": "hello", "previous_run_id": "run_01M806T4VB0000000000000001"});
    create(&key, "", missing).expect_error(404, "not_found");
}

// ---------------------------------------------------------------- list

pub(super) fn list_pages_newest_first_without_repeats_or_gaps(target: Target) {
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
    assert!(page["data"].as_array().unwrap().iter().all(|run| run.as_object().unwrap().len() == 14));
}

pub(super) fn list_filters_by_status_and_binds_the_cursor_to_the_filter(target: Target) {
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

pub(super) fn flip_one(text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    let i = bytes.len() / 2;
    bytes[i] = if bytes[i] == b'x' { b'y' } else { b'x' };
    String::from_utf8(bytes).unwrap()
}

pub(super) fn list_parameters_are_checked_strictly(target: Target) {
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

pub(super) fn a_created_run_is_in_the_next_list_and_get(target: Target) {
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

pub(super) fn get_answers_404_for_unknown_and_malformed_ids(target: Target) {
    let server = Server::start_on(target, &[]);
    let key = server.dev_key.clone().unwrap();
    for id in [UNKNOWN_RUN, "run_123", "nope", "run_01jdq3v7q4k8z2x9m5n6p7r8s9", "apr_01JDQ3V7Q4K8Z2X9M5N6P7R8S9"] {
        server.get(&key, &format!("{RUNS}/{id}")).expect_error(404, "not_found");
    }
}

pub(super) fn unknown_paths_answer_404_and_other_methods_405_with_allow(target: Target) {
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
