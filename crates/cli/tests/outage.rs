//! A dependency outage on the AWS path: with DynamoDB and SQS unreachable,
//! every operation answers `503` with `Retry-After` (never `500`), and once
//! they are back nothing accepted before is lost.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use support::{Server, Target};
use tokio::net::{TcpListener, TcpStream};

/// A TCP forwarder to the emulator that can be switched to drop every
/// connection, as a network partition would.
struct Partition {
    port: u16,
    down: Arc<AtomicBool>,
}

impl Partition {
    fn start(upstream: String) -> Partition {
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let down = Arc::new(AtomicBool::new(false));
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let flag = down.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                loop {
                    let (mut client, _) = listener.accept().await.unwrap();
                    if flag.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let upstream = upstream.clone();
                    let flag = flag.clone();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
                        // Connections opened before the outage die with it.
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = async { while !flag.load(Ordering::SeqCst) { tokio::time::sleep(Duration::from_millis(20)).await } } => {}
                        }
                    });
                }
            });
        });
        Partition { port: port_rx.recv().unwrap(), down }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

#[test]
fn an_outage_answers_503_with_retry_after_and_loses_nothing() {
    if support::without_emulator("an_outage_answers_503_with_retry_after_and_loses_nothing") {
        return;
    }
    let partition = Partition::start(support::aws_endpoint());
    let endpoint = format!("http://127.0.0.1:{}", partition.port);
    let server =
        Server::start_on(Target::Lambda, &[("AWS_ENDPOINT_URL", &endpoint), ("AGENT_RUNS_KEY_CACHE_SECS", "0")]);
    let key = server.dev_key.clone().unwrap();
    let before = server.create(&key, json!({"input": "before the outage"}));
    let id = before["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &id, "succeeded");

    partition.set_down(true);
    let path = format!("/v1/agent/runs/{id}");
    let replies = [
        server.get(&key, &path),
        server.get(&key, "/v1/agent/runs"),
        server.post(&key, "/v1/agent/runs", json!({"input": "during the outage"})),
        server.post(&key, &format!("{path}/cancel"), json!({})),
    ];
    for reply in &replies {
        let error = reply.expect_error(503, "unavailable");
        assert!(!error["message"].as_str().unwrap().contains("Dynamo"), "no internals: {error}");
        assert!(reply.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    }

    partition.set_down(false);
    let after = server.get(&key, &path).expect_status(200).clone();
    assert_eq!(after["status"], "succeeded");
    assert_eq!(after["output"], "before the outage");
    let listed = server.get(&key, "/v1/agent/runs").expect_status(200).clone();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "the refused create left nothing behind");
    let run = server.create(&key, json!({"input": "after the outage"}));
    server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
}
