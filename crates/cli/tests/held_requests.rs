//! Requests that hold their connection (event streams, `wait` long-polls)
//! against the real `agent-runs serve`: one owner cannot hold more than its
//! share, all owners together never the connections ordinary requests
//! need, a stream ends after its lifetime, and a revoked key's stream or
//! long-poll ends within the key cache's lifetime.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::Server;

/// Sends `GET <path>` asking for an event stream (on a connection closed
/// after it, so the stream's end is the connection's); returns the
/// connection and the response head once it has arrived.
fn open_stream(server: &Server, key: &str, path: &str, extra: &str) -> (TcpStream, String, String) {
    let address = server.base.strip_prefix("http://").unwrap();
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\nConnection: close\r\n{extra}\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let (received, _) = read_for(&mut stream, Duration::from_secs(10), |text| text.contains("\r\n\r\n"));
    let (head, rest) = received.split_once("\r\n\r\n").expect("a response head");
    (stream, head.to_owned(), rest.to_owned())
}

/// Reads until `enough` holds for what arrived, the server closes, or
/// `limit`; returns what arrived and whether the server closed.
fn read_for(stream: &mut TcpStream, limit: Duration, enough: impl Fn(&str) -> bool) -> (String, bool) {
    let deadline = Instant::now() + limit;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    while Instant::now() < deadline && !enough(&String::from_utf8_lossy(&received)) {
        match stream.read(&mut buffer) {
            Ok(0) => return (String::from_utf8_lossy(&received).into_owned(), true),
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(error) if error.kind() == ErrorKind::ConnectionReset => {
                return (String::from_utf8_lossy(&received).into_owned(), true);
            }
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(error) => panic!("read: {error}"),
        }
    }
    (String::from_utf8_lossy(&received).into_owned(), false)
}

fn waiting_run(server: &Server, key: &str) -> String {
    let run = server.create_script(key, "say waiting\napprove Delete 3 stale branches\nsay done");
    let id = run["id"].as_str().unwrap().to_owned();
    server.wait_for_status(key, &id, "awaiting_approval");
    id
}

/// The `id:` of the last message a stream sent.
fn last_event_id(stream_text: &str) -> String {
    stream_text.lines().rev().find_map(|line| line.strip_prefix("id: ")).expect("a message with an id").to_owned()
}

fn events_path(id: &str) -> String {
    format!("/v1/agent/runs/{id}/events")
}

#[track_caller]
fn assert_held_refused(head: &str, body: &str) {
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    let retry_after = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("retry-after:").map(|value| value.trim().to_owned()))
        .expect("Retry-After");
    assert!(retry_after.parse::<u64>().unwrap() >= 1, "{retry_after}");
    let body: Value = serde_json::from_str(body.trim()).unwrap_or_else(|_| panic!("a JSON error: {body}"));
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
}

#[test]
fn one_owner_cannot_hold_the_connections_that_others_need() {
    // 8 connections: streams and waiting polls may hold 4 of them.
    let server = Server::start_with(&[("AGENT_RUNS_MAX_CONNECTIONS", "8"), ("AGENT_RUNS_MAX_HELD_PER_OWNER", "3")]);
    let dev = server.dev_key.clone().unwrap();
    let acme = server.key("acme");
    let dev_run = waiting_run(&server, &dev);
    let acme_run = waiting_run(&server, &acme);

    let mut held = Vec::new();
    for _ in 0..3 {
        let (stream, head, _) = open_stream(&server, &dev, &events_path(&dev_run), "");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(stream);
    }
    // The owner's fourth stream, and a waiting poll, are refused.
    let (_, head, body) = open_stream(&server, &dev, &events_path(&dev_run), "");
    assert_held_refused(&head, &body);
    // A poll that does not wait, or has something to answer at once, is an
    // ordinary request.
    let last = server.get(&dev, &events_path(&dev_run)).expect_status(200)["next_after"].as_u64().unwrap();
    server.get(&dev, &format!("{}?wait=5", events_path(&dev_run))).expect_status(200);
    let reply = server.get(&dev, &format!("{}?after={last}&wait=5", events_path(&dev_run)));
    reply.expect_error(429, "rate_limited");
    assert!(reply.header("retry-after").is_some());

    // Another owner may hold one more: then all the server allows are held.
    let (stream, head, _) = open_stream(&server, &acme, &events_path(&acme_run), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    held.push(stream);
    let (_, head, body) = open_stream(&server, &acme, &events_path(&acme_run), "");
    assert_held_refused(&head, &body);

    // Ordinary requests of every owner are answered at once all the same.
    for key in [&acme, &dev] {
        let started = Instant::now();
        server.get(key, "/v1/agent/runs").expect_status(200);
        assert!(started.elapsed() < Duration::from_secs(5), "a list waited {:?}", started.elapsed());
    }
    drop(held);
}

#[test]
fn a_stream_is_ended_after_its_lifetime_and_resumes_where_it_stopped() {
    let server = Server::start_with(&[("AGENT_RUNS_STREAM_MAX_SECS", "2")]);
    let key = server.dev_key.clone().unwrap();
    let id = waiting_run(&server, &key);
    let started = Instant::now();
    let (mut stream, head, first) = open_stream(&server, &key, &events_path(&id), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (rest, closed) = read_for(&mut stream, Duration::from_secs(15), |_| false);
    assert!(closed, "the stream was still open after {:?}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_millis(1_900), "ended early: {:?}", started.elapsed());
    let text = first + &rest;
    assert!(text.contains("event: run.awaiting_approval"), "{text}");

    // The client resumes after the last id it saw, and gets only what is new.
    let last_id = last_event_id(&text);
    let (mut resumed, head, _) =
        open_stream(&server, &key, &events_path(&id), &format!("Last-Event-ID: {last_id}\r\n"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let run = server.get(&key, &format!("/v1/agent/runs/{id}")).expect_status(200).clone();
    let approval = run["pending_approvals"][0]["id"].as_str().unwrap().to_owned();
    server
        .post(&key, &format!("/v1/agent/runs/{id}/approvals/{approval}"), serde_json::json!({"decision": "approve"}))
        .expect_status(200);
    let (more, _) = read_for(&mut resumed, Duration::from_secs(10), |text| text.contains("event: approval.decided"));
    assert!(more.contains("event: approval.decided"), "{more}");
    assert!(!more.contains("event: run.created"), "resumed from the start: {more}");
}

#[test]
fn a_revoked_key_s_stream_and_long_poll_end_and_see_no_later_event() {
    let server = Server::start_with(&[("AGENT_RUNS_KEY_CACHE_SECS", "1")]);
    let revoked = server.dev_key.clone().unwrap();
    let other = server.key("dev");
    let run = server.create_script(&revoked, "approve Delete 3 stale branches\nsay done");
    let (id, key_id) = (run["id"].as_str().unwrap().to_owned(), run["created_by"].as_str().unwrap().to_owned());
    server.wait_for_status(&revoked, &id, "awaiting_approval");

    let (mut stream, head, first) = open_stream(&server, &revoked, &events_path(&id), "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (seen, _) = read_for(&mut stream, Duration::from_secs(5), |text| text.contains("run.awaiting_approval"));
    let seen = first + &seen;
    assert!(seen.contains("event: run.awaiting_approval"), "{seen}");
    let last = last_event_id(&seen);
    let poll = {
        let client = support::http_client().timeout(Duration::from_secs(30)).build().unwrap();
        let url = format!("{}{}?after={last}&wait=20", server.base, events_path(&id));
        let key = revoked.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let status = client.get(url).bearer_auth(key).send().unwrap().status().as_u16();
            (status, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));

    server.admin(&["keys", "revoke", &key_id]);
    let revoked_at = Instant::now();
    // Past the key cache's lifetime (1 s), a decision by another key.
    std::thread::sleep(Duration::from_millis(2_500));
    let approval = server.get(&other, &format!("/v1/agent/runs/{id}")).expect_status(200)["pending_approvals"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    server
        .post(&other, &format!("/v1/agent/runs/{id}/approvals/{approval}"), serde_json::json!({"decision": "approve"}))
        .expect_status(200);

    let (after, closed) = read_for(&mut stream, Duration::from_secs(5), |_| false);
    assert!(closed, "the revoked key's stream is still open {:?} after the revocation", revoked_at.elapsed());
    assert!(!after.contains("approval.decided"), "the revoked key's stream saw the decision: {after}");
    let (status, held) = poll.join().unwrap();
    assert_eq!(status, 401, "the revoked key's long-poll");
    assert!(held < Duration::from_secs(10), "the long-poll was held {held:?}");
}

/// Where a deployment holds long-polls for less (the events function on
/// Lambda, `AGENT_RUNS_MAX_WAIT_SECS`), a `wait` of 20 is still accepted
/// and answered, empty, when that shorter time is up.
#[test]
fn a_wait_longer_than_the_deployment_holds_is_answered_when_its_time_is_up() {
    let server = Server::start_with(&[("AGENT_RUNS_MAX_WAIT_SECS", "1")]);
    let key = server.dev_key.clone().unwrap();
    let id = waiting_run(&server, &key);
    let last = server.get(&key, &events_path(&id)).expect_status(200)["next_after"].as_u64().unwrap();
    let started = Instant::now();
    let page = server.get(&key, &format!("{}?after={last}&wait=20", events_path(&id))).expect_status(200).clone();
    assert!(started.elapsed() >= Duration::from_millis(900), "not held: {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(10), "held {:?}", started.elapsed());
    assert_eq!(page["data"], serde_json::json!([]), "{page}");
    assert_eq!(page["next_after"], last);
}
