//! Webhooks of the embedded server, verified by a receiver that uses the
//! `standardwebhooks` package from PyPI (infra/webhook_receiver.py): every
//! delivery must pass the reference library, and a tampered body or a wrong
//! secret must not. Also: endpoint rules, retries, 410, redirects, a slow
//! endpoint beside a fast one, and kill -9 in the middle of deliveries.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde_json::{Value, json};
use support::Server;
use support::receiver::{Receiver, delivered_ids};

const ALLOW_PRIVATE: (&str, &str) = ("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true");

fn create_webhook(server: &Server, key: &str, url: &str, events: Value) -> Value {
    server.post(key, "/v1/webhooks", json!({"url": url, "events": events})).expect_status(201).clone()
}

/// The ids of every event of the runs, from the API.
fn event_ids(server: &Server, key: &str, runs: &[String]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for run in runs {
        let page = server.get(key, &format!("/v1/agent/runs/{run}/events?limit=1000")).expect_status(200).clone();
        ids.extend(page["data"].as_array().unwrap().iter().map(|event| event["id"].as_str().unwrap().to_owned()));
    }
    ids
}

#[test]
fn every_event_is_delivered_signed_so_the_standard_library_verifies_it_and_refuses_tampering() {
    let receiver = Receiver::start();
    let server = Server::start_with(&[ALLOW_PRIVATE]);
    let key = server.dev_key.clone().unwrap();

    let all = create_webhook(&server, &key, &receiver.url("all"), json!(["*"]));
    let secret = all["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{all}");
    assert!(all["id"].as_str().unwrap().starts_with("wh_"));
    assert_eq!((all["status"].as_str(), all["events"].clone()), (Some("enabled"), json!(["*"])));
    receiver.configure("all", json!({"secrets": [secret]}));
    let done = create_webhook(&server, &key, &receiver.url("done"), json!(["run.succeeded"]));
    receiver.configure("done", json!({"secrets": [done["secret"]]}));

    let run = server.create_script(&key, "say hello\nsay world")["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &run, "succeeded");
    let expected = event_ids(&server, &key, std::slice::from_ref(&run));
    let received = receiver.wait_for("all", Duration::from_secs(20), |got| delivered_ids(got) == expected);
    for delivery in &received {
        assert_eq!(delivery["verified_by"], json!([0]), "standardwebhooks verifies every delivery: {delivery}");
        assert_eq!(delivery["headers"]["content-type"], "application/json");
        let body: Value = serde_json::from_str(delivery["body"].as_str().unwrap()).unwrap();
        let event = &body["data"];
        assert_eq!(event["id"], delivery["headers"]["webhook-id"], "webhook-id is the event's id");
        assert_eq!(body["type"], event["type"]);
        assert_eq!(body["timestamp"], event["created_at"]);
        assert_eq!(event["run_id"], run.as_str());
        let sent_at: i64 = delivery["headers"]["webhook-timestamp"].as_str().unwrap().parse().unwrap();
        assert!((sent_at - delivery["at"].as_f64().unwrap() as i64).abs() <= 5, "webhook-timestamp is now");
    }
    let finished = receiver.wait_for("done", Duration::from_secs(10), |got| !got.is_empty());
    std::thread::sleep(Duration::from_millis(300));
    let finished_again = receiver.received("done");
    assert_eq!(finished.len(), 1, "only the subscribed type: {finished_again:#?}");
    assert_eq!(finished_again.len(), 1);
    let body: Value = serde_json::from_str(finished[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["type"], "run.succeeded");
    assert_eq!(body["data"]["data"]["output"], "hello\nworld");

    // The reference library refuses a tampered body and a wrong secret; the
    // untouched delivery sent again passes (so the refusals are not noise).
    let original = &received[0];
    let body = original["body"].as_str().unwrap();
    assert_eq!(receiver.replay("all", original, body), 200);
    assert_eq!(receiver.replay("all", original, &body.replacen("run_", "run-", 1)), 401);
    let other = create_webhook(&server, &key, &receiver.url("unused"), json!(["run.failed"]));
    receiver.configure("wrong-secret", json!({"secrets": [other["secret"]]}));
    assert_eq!(receiver.replay("wrong-secret", original, body), 401);

    // Each attempt is listed, newest first.
    let webhook_id = all["id"].as_str().unwrap();
    let attempts =
        server.get(&key, &format!("/v1/webhooks/{webhook_id}/deliveries?limit=100")).expect_status(200).clone();
    let attempts = attempts["data"].as_array().unwrap();
    assert_eq!(attempts.len(), expected.len());
    for attempt in attempts {
        assert_eq!((attempt["attempt"].as_u64(), attempt["http_status"].as_u64()), (Some(1), Some(200)), "{attempt}");
        assert!(attempt["id"].as_str().unwrap().starts_with("dlv_") && attempt["error"].is_null());
        assert!(expected.contains(attempt["event_id"].as_str().unwrap()));
        assert!(support::is_timestamp(&attempt["at"]));
    }
    let times: Vec<&str> = attempts.iter().map(|attempt| attempt["id"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|pair| pair[0] > pair[1]), "newest first");

    // After a rotation, deliveries carry a signature with each secret: a
    // receiver that knows only one of them still verifies.
    let rotated =
        server.post(&key, &format!("/v1/webhooks/{webhook_id}/rotate-secret"), json!({})).expect_status(200).clone();
    let new_secret = rotated["secret"].as_str().unwrap();
    assert_ne!(new_secret, secret);
    receiver.configure("all", json!({"secrets": [secret, new_secret]}));
    let before = receiver.received("all").len();
    let run = server.create(&key, json!({"input": "after the rotation"}))["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &run, "succeeded");
    let later = receiver.wait_for("all", Duration::from_secs(20), |got| got.len() >= before + 3);
    for delivery in &later[before..] {
        assert_eq!(delivery["verified_by"], json!([0, 1]), "both secrets verify for a day: {delivery}");
    }
    // The secret is shown only when made.
    let shown = server.get(&key, &format!("/v1/webhooks/{webhook_id}")).expect_status(200).clone();
    assert!(shown.get("secret").is_none(), "{shown}");
    let listed = server.get(&key, "/v1/webhooks").expect_status(200).clone();
    assert_eq!(listed["data"].as_array().unwrap().len(), 3);
    assert!(listed["data"].as_array().unwrap().iter().all(|endpoint| endpoint.get("secret").is_none()));
}

#[test]
fn failures_are_retried_gone_disables_and_redirects_are_not_followed() {
    let receiver = Receiver::start();
    let server = Server::start_with(&[ALLOW_PRIVATE]);
    let key = server.dev_key.clone().unwrap();
    let mut endpoints = HashMap::new();
    for (name, config) in [
        ("failing", json!({"status": 500})),
        ("gone", json!({"status": 410})),
        ("redirecting", json!({"status": 302, "location": "/hooks/redirected"})),
    ] {
        let endpoint = create_webhook(&server, &key, &receiver.url(name), json!(["run.created"]));
        let mut config = config;
        config["secrets"] = json!([endpoint["secret"]]);
        receiver.configure(name, config);
        endpoints.insert(name, endpoint["id"].as_str().unwrap().to_owned());
    }
    server.create(&key, json!({"input": "one"}));

    // 500: attempt 1 at once, attempt 2 about 5 s later, each recorded.
    let failing = &endpoints["failing"];
    let received = receiver.wait_for("failing", Duration::from_secs(15), |got| got.len() >= 2);
    assert_eq!(received[0]["headers"]["webhook-id"], received[1]["headers"]["webhook-id"], "the same id on a retry");
    let gap = received[1]["at"].as_f64().unwrap() - received[0]["at"].as_f64().unwrap();
    assert!((3.5..=8.0).contains(&gap), "the first retry comes about 5 s later: {gap}");
    let attempts = server.get(&key, &format!("/v1/webhooks/{failing}/deliveries")).expect_status(200).clone();
    let attempts = attempts["data"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!((attempts[0]["attempt"].as_u64(), attempts[1]["attempt"].as_u64()), (Some(2), Some(1)));
    assert_eq!(attempts[0]["http_status"], 500);
    assert!(attempts[0]["error"].as_str().unwrap().contains("500"), "{}", attempts[0]);
    let endpoint = server.get(&key, &format!("/v1/webhooks/{failing}")).expect_status(200).clone();
    assert_eq!(endpoint["status"], "enabled", "a few failures do not disable");

    // 410 Gone: disabled at once, and nothing more is sent to it.
    let gone = &endpoints["gone"];
    let endpoint = server.get(&key, &format!("/v1/webhooks/{gone}")).expect_status(200).clone();
    assert_eq!(endpoint["status"], "disabled", "{endpoint}");
    assert_eq!(receiver.received("gone").len(), 1);
    let attempts = server.get(&key, &format!("/v1/webhooks/{gone}/deliveries")).expect_status(200).clone();
    assert_eq!(attempts["data"][0]["http_status"], 410);

    // A redirect is a failed attempt; the target is never called.
    let redirecting = &endpoints["redirecting"];
    let attempts = server.get(&key, &format!("/v1/webhooks/{redirecting}/deliveries")).expect_status(200).clone();
    assert_eq!(attempts["data"][0]["http_status"], 302, "{attempts}");
    assert!(receiver.received("redirected").is_empty(), "redirects are not followed");

    server.create(&key, json!({"input": "two"}));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(receiver.received("gone").len(), 1, "a disabled endpoint gets nothing");
}

#[test]
fn a_slow_endpoint_does_not_hold_up_a_fast_one() {
    let receiver = Receiver::start();
    let server = Server::start_with(&[ALLOW_PRIVATE]);
    let key = server.dev_key.clone().unwrap();
    for (name, delay) in [("slow", 2.0), ("fast", 0.0)] {
        let endpoint = create_webhook(&server, &key, &receiver.url(name), json!(["*"]));
        receiver.configure(name, json!({"secrets": [endpoint["secret"]], "delay": delay}));
    }
    let runs: Vec<String> = (0..8)
        .map(|i| server.create(&key, json!({"input": format!("r{i}")}))["id"].as_str().unwrap().to_owned())
        .collect();
    for run in &runs {
        server.wait_for_status(&key, run, "succeeded");
    }
    let expected = event_ids(&server, &key, &runs);
    receiver.wait_for("fast", Duration::from_secs(10), |got| delivered_ids(got) == expected);
    let slow = receiver.received("slow").len();
    assert!(slow < expected.len() / 2, "the slow endpoint is still far behind ({slow} of {})", expected.len());
}

#[test]
fn kill_9_in_the_middle_of_deliveries_loses_none_of_them() {
    let receiver = Receiver::start();
    let server = Server::start_with(&[ALLOW_PRIVATE]);
    let key = server.dev_key.clone().unwrap();
    let endpoint = create_webhook(&server, &key, &receiver.url("all"), json!(["*"]));
    receiver.configure("all", json!({"secrets": [endpoint["secret"]], "delay": 0.05}));
    let runs: Vec<String> = (0..30)
        .map(|i| server.create(&key, json!({"input": format!("crash {i}")}))["id"].as_str().unwrap().to_owned())
        .collect();
    receiver.wait_for("all", Duration::from_secs(20), |got| got.len() >= 10);

    let server = server.crash_and_restart();
    for run in &runs {
        server.wait_for_status(&key, run, "succeeded");
    }
    let expected = event_ids(&server, &key, &runs);
    let received = receiver.wait_for("all", Duration::from_secs(60), |got| delivered_ids(got).is_superset(&expected));
    assert!(received.iter().all(|delivery| delivery["verified_by"] == json!([0])));
    assert!(delivered_ids(&received).is_subset(&expected), "nothing but the runs' events");
}

#[test]
fn endpoint_rules_bad_input_and_owners() {
    let server = Server::start();
    let key = server.dev_key.clone().unwrap();
    let refused = |body: Value, param: &str, says: &str| {
        let reply = server.post(&key, "/v1/webhooks", body.clone());
        let error = reply.expect_error(400, "invalid_request").clone();
        assert_eq!(error["param"], param, "{body}: {error}");
        assert!(error["message"].as_str().unwrap().contains(says), "{body}: {error}");
    };
    let events = json!(["run.succeeded"]);
    refused(json!({"url": "http://example.com/hook", "events": events}), "url", "https");
    refused(json!({"url": "ftp://example.com/hook", "events": events}), "url", "https");
    refused(json!({"url": "not a url", "events": events}), "url", "valid");
    refused(json!({"url": "https://user:pw@example.com/hook", "events": events}), "url", "password");
    for private in [
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://172.16.0.1/hook",
        "https://192.168.1.1/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://100.64.0.1/hook",
        "https://224.0.0.1/hook",
        "https://[::1]/hook",
        "https://[fd00:ec2::254]/hook",
        "https://[::ffff:10.0.0.1]/hook",
        "https://[::ffff:0:7f00:1]/",
        "https://localhost/hook",
    ] {
        refused(json!({"url": private, "events": events}), "url", "non-public");
    }
    refused(json!({"url": "https://example.com/hook", "events": ["run.done"]}), "events", "run.done");
    refused(json!({"url": "https://example.com/hook", "events": []}), "events", "at least one");
    refused(json!({"url": "https://example.com/hook", "events": ["*", "run.failed"]}), "events", "*");
    refused(json!({"url": "https://example.com/hook"}), "events", "required");
    refused(json!({"events": events}), "url", "required");
    let reply =
        server.post(&key, "/v1/webhooks", json!({"url": "https://example.com/h", "events": events, "secret": "x"}));
    reply.expect_error(400, "invalid_request");

    let mut ids = Vec::new();
    for i in 0..20 {
        let endpoint = create_webhook(&server, &key, &format!("https://example.com/hook/{i}"), events.clone());
        ids.push(endpoint["id"].as_str().unwrap().to_owned());
    }
    let reply = server.post(&key, "/v1/webhooks", json!({"url": "https://example.com/21", "events": events}));
    let error = reply.expect_error(400, "invalid_request");
    assert!(error["message"].as_str().unwrap().contains("20"), "{error}");

    // Pages, newest first.
    let first = server.get(&key, "/v1/webhooks?limit=15").expect_status(200).clone();
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let second = server.get(&key, &format!("/v1/webhooks?limit=15&cursor={cursor}")).expect_status(200).clone();
    assert!(second["next_cursor"].is_null());
    let listed: Vec<String> = [&first, &second]
        .iter()
        .flat_map(|page| page["data"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()))
        .collect();
    let mut newest_first = ids.clone();
    newest_first.reverse();
    assert_eq!(listed, newest_first);

    // Another owner sees none of them; a malformed id is a 404 too.
    let other = server.key("other");
    let id = &ids[0];
    server.get(&other, &format!("/v1/webhooks/{id}")).expect_error(404, "not_found");
    server
        .send(server.request("DELETE", &format!("/v1/webhooks/{id}")).bearer_auth(&other))
        .expect_error(404, "not_found");
    server.post(&other, &format!("/v1/webhooks/{id}/rotate-secret"), json!({})).expect_error(404, "not_found");
    server.get(&other, &format!("/v1/webhooks/{id}/deliveries")).expect_error(404, "not_found");
    assert_eq!(server.get(&other, "/v1/webhooks").expect_status(200)["data"], json!([]));
    server.get(&key, "/v1/webhooks/wh_nope").expect_error(404, "not_found");
    server.get(&key, &format!("/v1/webhooks?cursor={cursor}x")).expect_error(400, "invalid_request");
    server.get(&key, "/v1/webhooks?limit=0").expect_error(400, "invalid_request");
    server.get(&key, "/v1/webhooks?color=red").expect_error(400, "invalid_request");

    // Delete frees a place; the endpoint is gone.
    let deleted = server.send(server.request("DELETE", &format!("/v1/webhooks/{id}")).bearer_auth(&key));
    assert_eq!(deleted.expect_status(200).clone(), json!({"id": id, "deleted": true}));
    server.get(&key, &format!("/v1/webhooks/{id}")).expect_error(404, "not_found");
    server
        .send(server.request("DELETE", &format!("/v1/webhooks/{id}")).bearer_auth(&key))
        .expect_error(404, "not_found");
    create_webhook(&server, &key, "https://example.com/again", events.clone());

    // Scopes: webhooks:manage is needed; method and path rules hold.
    let reader = server.admin(&["keys", "create", "--owner", "dev", "--scope", "runs:read"]).trim().to_owned();
    let error = server.get(&reader, "/v1/webhooks").expect_error(403, "forbidden").clone();
    assert!(error["message"].as_str().unwrap().contains("webhooks:manage"), "{error}");
    let manager = server.admin(&["keys", "create", "--owner", "dev", "--scope", "webhooks:manage"]).trim().to_owned();
    assert_eq!(server.get(&manager, "/v1/webhooks").status, 200);
    let reply = server.send(server.request("PUT", "/v1/webhooks").bearer_auth(&key));
    reply.expect_error(405, "method_not_allowed");
    assert_eq!(reply.header("allow"), Some("GET, POST"));
}
