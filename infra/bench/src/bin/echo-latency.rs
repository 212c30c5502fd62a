//! Create -> succeeded latency of `echo` runs, as a client sees it: create,
//! then poll the run with no pause until it has succeeded.
//! Usage: echo-latency HOST:PORT API_KEY [RUNS]

use std::time::{Duration, Instant};

use agent_runs_bench::{Connection, millis, percentile};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let authority = args.next().expect("HOST:PORT");
    let key = args.next().expect("API key");
    let runs: usize = args.next().map_or(500, |n| n.parse().expect("a number of runs"));
    let auth = format!("Bearer {key}");
    let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let mut connection = Connection::open(&authority).await;
    let mut samples = Vec::with_capacity(runs);
    let mut polls = 0usize;
    for i in 0..runs + 20 {
        let started = Instant::now();
        let (status, body) = connection.send("POST", "/v1/agent/runs", &headers, Some(r#"{"input": "ping"}"#)).await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
        let run: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let path = format!("/v1/agent/runs/{}", run["id"].as_str().unwrap());
        loop {
            let (status, body) = connection.send("GET", &path, &headers, None).await;
            assert_eq!(status, 200);
            polls += 1;
            let run: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if run["status"] == "succeeded" {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "run did not finish: {run}");
        }
        if i >= 20 {
            // The first 20 warm the connection, the caches and the workers.
            samples.push(started.elapsed());
        }
    }
    samples.sort();
    println!(
        "echo create->succeeded over {runs} runs: p50 {}  p99 {}  max {}  ({:.1} polls per run)",
        millis(percentile(&samples, 50.0)),
        millis(percentile(&samples, 99.0)),
        millis(*samples.last().unwrap()),
        polls as f64 / (runs + 20) as f64
    );
}
