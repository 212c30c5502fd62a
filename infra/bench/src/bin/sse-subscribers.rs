//! Many clients following runs as Server-Sent Events while others create
//! runs: starts `n` script runs that wait for an approval, opens one event
//! stream on each, reports the server's memory and CPU with them open and
//! idle, holds them for `hold` seconds (bench.sh measures creates
//! meanwhile), then cancels every run and times until each stream has seen
//! its `run.canceled` and ended.
//!
//! Usage: sse-subscribers <host:port> <api key> <subscribers> <hold seconds> <server pid>

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request on a fresh connection; the body of the answer.
async fn call(addr: &str, key: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// Resident memory (MB) and CPU time used so far (s) of a process.
fn usage(pid: &str) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |times| times.iter().filter_map(|t| t.parse::<f64>().ok()).sum());
    (rss_kb / 1024.0, ticks / 100.0)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, key, subscribers, hold, pid] = args.as_slice() else {
        eprintln!("usage: sse-subscribers <host:port> <api key> <subscribers> <hold seconds> <server pid>");
        std::process::exit(2);
    };
    let subscribers: usize = subscribers.parse().expect("subscribers");
    let hold = Duration::from_secs(hold.parse().expect("hold seconds"));
    let (addr, key) = (Arc::new(addr.clone()), Arc::new(key.clone()));

    let mut runs = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        let run = call(&addr, &key, "POST", "/v1/agent/runs", r#"{"agent": "script", "input": "approve hold"}"#).await;
        let value: serde_json::Value = serde_json::from_str(&run).expect("a run");
        runs.push(value["id"].as_str().expect("an id").to_owned());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_before, _) = usage(pid);

    let connected = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::with_capacity(subscribers);
    for run in &runs {
        let (addr, key, connected) = (addr.clone(), key.clone(), connected.clone());
        let path = format!("/v1/agent/runs/{run}/events");
        streams.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr.as_str()).await.expect("connect");
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.expect("send");
            let mut seen = Vec::new();
            let mut buffer = vec![0u8; 16 * 1024];
            let mut counted = false;
            loop {
                let read = stream.read(&mut buffer).await.expect("read");
                if read == 0 {
                    return (seen, None);
                }
                seen.extend_from_slice(&buffer[..read]);
                if !counted && seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    counted = true;
                    connected.fetch_add(1, Ordering::SeqCst);
                }
                // The chunked body's last chunk: the stream has ended.
                if seen.ends_with(b"0\r\n\r\n") && seen.windows(12).any(|w| w == b"run.canceled") {
                    return (Vec::new(), Some(Instant::now()));
                }
            }
        }));
    }
    while connected.load(Ordering::SeqCst) < subscribers {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rss_open, cpu_open) = usage(pid);
    println!(
        "{subscribers} event streams open: server RSS {rss_open:.1} MB (before {rss_before:.1} MB, {:.1} KB per stream)",
        (rss_open - rss_before) * 1024.0 / subscribers as f64
    );
    tokio::time::sleep(Duration::from_secs(16)).await;
    let (_, cpu_idle) = usage(pid);
    println!("idle with {subscribers} streams for 16 s (one heartbeat each): server CPU {:.2} s", cpu_idle - cpu_open);
    println!("READY");
    tokio::time::sleep(hold).await;
    let (rss_load, _) = usage(pid);
    println!("after the load: server RSS {rss_load:.1} MB");

    let canceled_at = Instant::now();
    for run in &runs {
        call(&addr, &key, "POST", &format!("/v1/agent/runs/{run}/cancel"), "").await;
    }
    let cancels_took = canceled_at.elapsed();
    let mut last = canceled_at;
    let mut ended = 0;
    for stream in streams {
        if let (_, Some(at)) = stream.await.expect("stream task") {
            ended += 1;
            last = last.max(at);
        }
    }
    println!(
        "canceled {subscribers} runs in {:.2} s; {ended} of {subscribers} streams got run.canceled and ended, the last {:.2} s after the first cancel",
        cancels_took.as_secs_f64(),
        last.duration_since(canceled_at).as_secs_f64()
    );
}
