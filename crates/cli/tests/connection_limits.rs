//! `agent-runs serve` bounds what one client can hold: a request head that
//! does not arrive in time closes its connection, a body that stalls is
//! answered `408`, at most `--max-connections` are open at once, and a
//! failing `accept` (out of file descriptors) is retried with a backoff
//! instead of in a spin. Raw TCP against the real binary.

mod support;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{BIN, Server};

fn connect(server: &Server) -> TcpStream {
    let address = server.base.strip_prefix("http://").unwrap();
    let stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream
}

/// Reads until the server closes the connection (or the read timeout);
/// returns what arrived and whether it was a close.
fn read_to_close(stream: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return (received, true),
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            // A reset is a close too.
            Err(error) if error.kind() == ErrorKind::ConnectionReset => return (received, true),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return (received, false);
            }
            Err(error) => panic!("read: {error}"),
        }
    }
}

/// One response read from a keep-alive connection: the head and the body
/// (by Content-Length).
fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).expect("read the response head") > 0, "closed before an answer");
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
        .map_or(0, |value| value.parse::<usize>().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (head, body)
}

fn get_openapi(stream: &mut TcpStream) -> String {
    stream.write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let (head, _) = read_response(stream);
    head
}

#[test]
fn a_request_head_that_does_not_arrive_in_time_closes_the_connection() {
    let server = Server::start_with(&[("AGENT_RUNS_HEADER_TIMEOUT_SECS", "1")]);

    // Half a request line, then nothing.
    let mut partial = connect(&server);
    partial.write_all(b"GET /v1/agent/ru").unwrap();
    let started = Instant::now();
    let (received, closed) = read_to_close(&mut partial);
    assert!(closed, "the server still holds the connection after {:?}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before the timeout: {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(15), "closed only after {:?}", started.elapsed());
    // hyper answers nothing or a bare 408; never a request's answer.
    let text = String::from_utf8_lossy(&received);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");

    // A connection that never sends a byte is closed too.
    let mut silent = connect(&server);
    let (_, closed) = read_to_close(&mut silent);
    assert!(closed, "a silent connection is held");

    // So is a keep-alive connection left idle after an answer.
    let mut idle = connect(&server);
    assert!(get_openapi(&mut idle).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    let (received, closed) = read_to_close(&mut idle);
    assert!(closed && received.is_empty(), "an idle connection is held: {:?}", String::from_utf8_lossy(&received));
    assert!(started.elapsed() < Duration::from_secs(15));

    // A client that sends its request in time is served as ever.
    let mut prompt = connect(&server);
    assert!(get_openapi(&mut prompt).starts_with("HTTP/1.1 200"));
}

#[test]
fn a_body_that_stalls_is_answered_408_in_the_error_format_and_the_connection_closed() {
    let server = Server::start_with(&[("AGENT_RUNS_BODY_TIMEOUT_SECS", "1")]);
    let key = server.dev_key.clone().unwrap();

    let mut stream = connect(&server);
    let head = format!(
        "POST /v1/agent/runs HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(br#"{"input": "#).unwrap();
    let started = Instant::now();
    let (received, closed) = read_to_close(&mut stream);
    assert!(closed, "the connection is closed after the answer");
    assert!(started.elapsed() >= Duration::from_millis(900), "answered before the timeout: {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(15), "answered only after {:?}", started.elapsed());

    let text = String::from_utf8(received).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 408"), "{head}");
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert!(head.contains("\r\ncontent-type: application/json"), "{head}");
    assert!(head.contains("\r\nx-request-id: "), "{head}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    assert!(!body["error"]["message"].as_str().unwrap().is_empty());

    // Nothing was created, and a body sent whole is accepted.
    let page = server.get(&key, "/v1/agent/runs").expect_status(200).clone();
    assert_eq!(page["data"].as_array().unwrap().len(), 0, "{page}");
    server.create(&key, serde_json::json!({"input": "on time"}));
}

/// A body cut short (its connection's write side closed before the
/// declared length arrived) is refused `400` and changes nothing: never
/// executed as if it were empty.
#[test]
fn a_body_cut_short_is_refused_and_changes_nothing() {
    let server = Server::start();
    let key = server.dev_key.clone().unwrap();
    let run = server.create_script(&key, "approve Wait here");
    let id = run["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &id, "awaiting_approval");

    let mut stream = connect(&server);
    let head = format!(
        "POST /v1/agent/runs/{id}/cancel HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{{\"a\": 1, "
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let (received, _) = read_to_close(&mut stream);
    let text = String::from_utf8(received).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("Content-Length"), "{body}");

    let after = server.get(&key, &format!("/v1/agent/runs/{id}")).expect_status(200).clone();
    assert_eq!(after["status"], "awaiting_approval", "the cut-short cancel changed the run: {after}");
}

#[test]
fn beyond_the_connection_cap_a_connection_waits_until_one_closes() {
    let server = Server::start_with(&[("AGENT_RUNS_MAX_CONNECTIONS", "2"), ("AGENT_RUNS_HEADER_TIMEOUT_SECS", "60")]);

    // Two connections, each answered once and kept open.
    let mut first = connect(&server);
    let mut second = connect(&server);
    assert!(get_openapi(&mut first).starts_with("HTTP/1.1 200"));
    assert!(get_openapi(&mut second).starts_with("HTTP/1.1 200"));

    // The third gets through the kernel's backlog but is not served.
    let mut third = connect(&server);
    third.write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    third.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let mut byte = [0u8; 1];
    match third.read(&mut byte) {
        Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a connection beyond the cap was served or dropped: {other:?}"),
    }
    // The two held connections still work.
    assert!(get_openapi(&mut first).starts_with("HTTP/1.1 200"));

    // Once one closes, the waiting one is served.
    drop(second);
    third.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let (head, body) = read_response(&mut third);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(serde_json::from_slice::<Value>(&body).unwrap()["openapi"].is_string());
}

/// Counts the server's "accept failed" warnings while it is out of file
/// descriptors: with the backoff there are a handful a second, not
/// thousands; once descriptors are free again it serves.
#[cfg(target_os = "linux")]
#[test]
fn out_of_file_descriptors_the_server_backs_off_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    // A low descriptor limit for the server only.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" serve --addr 127.0.0.1:0 --db "$1""#)
        .arg(BIN)
        .arg(&db)
        .env("AGENT_RUNS_LOG", "warn")
        .env("AGENT_RUNS_HEADER_TIMEOUT_SECS", "60")
        .env("AGENT_RUNS_MAX_CONNECTIONS", "1000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let _child = Kill(child);
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let (warnings_tx, warnings_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("accept failed") {
                let _ = warnings_tx.send(Instant::now());
            }
        }
    });
    let address = loop {
        let line = lines_rx.recv_timeout(Duration::from_secs(30)).expect("server prints its address");
        if let Some(rest) = line.strip_prefix("Listening on http://") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };

    // More connections than the server has descriptors: each accepted one
    // is held (it has not sent its request), the rest wait in the backlog.
    let mut held: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(&address).unwrap()).collect();
    let first = warnings_rx.recv_timeout(Duration::from_secs(15)).expect("accept fails once descriptors run out");
    std::thread::sleep(Duration::from_secs(2));
    let in_two_seconds = warnings_rx.try_iter().filter(|at| *at <= first + Duration::from_secs(2)).count();
    assert!(in_two_seconds <= 20, "{in_two_seconds} failed accepts in 2 s: spinning");

    // Free the descriptors: the connections still waiting are accepted and served.
    held.clear();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut stream = TcpStream::connect(&address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if stream.write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").is_ok() {
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
            if answer.starts_with(b"HTTP/1.1 200") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the server did not recover");
        std::thread::sleep(Duration::from_millis(100));
    }
}
