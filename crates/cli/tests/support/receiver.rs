//! The tests' webhook receiver (infra/webhook_receiver.py), which
//! verifies every delivery with the `standardwebhooks` package from PyPI.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Receiver {
    child: Child,
    base: String,
    client: reqwest::blocking::Client,
}

impl Receiver {
    pub fn start() -> Receiver {
        let python = std::env::var("AGENT_RUNS_TEST_WEBHOOK_PYTHON").expect(
            "AGENT_RUNS_TEST_WEBHOOK_PYTHON names a Python with standardwebhooks (bash infra/test.sh sets it up)",
        );
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/webhook_receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the webhook receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening ").expect("the receiver prints its port").to_owned();
        let client = super::http_client().timeout(Duration::from_secs(10)).build().unwrap();
        Receiver { child, base: format!("http://127.0.0.1:{port}"), client }
    }

    pub fn url(&self, name: &str) -> String {
        format!("{}/hooks/{name}", self.base)
    }

    pub fn configure(&self, name: &str, config: Value) {
        let response = self.client.put(format!("{}/config/{name}", self.base)).json(&config).send().unwrap();
        assert!(response.status().is_success());
    }

    pub fn received(&self, name: &str) -> Vec<Value> {
        let all: Vec<Value> = self.client.get(format!("{}/received", self.base)).send().unwrap().json().unwrap();
        all.into_iter().filter(|delivery| delivery["name"] == name).collect()
    }

    /// Waits until `done` holds for what `name` received.
    #[track_caller]
    pub fn wait_for(&self, name: &str, timeout: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received(name);
            if done(&received) {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not receive what was expected in {timeout:?}: {received:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a delivery as received, with `body` instead of its own: the
    /// receiver's answer.
    pub fn replay(&self, name: &str, delivery: &Value, body: &str) -> u16 {
        let mut request = self.client.post(self.url(name)).body(body.to_owned());
        for (header, value) in delivery["headers"].as_object().unwrap() {
            if let Some(value) = value.as_str() {
                request = request.header(header.as_str(), value);
            }
        }
        request.send().unwrap().status().as_u16()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `webhook-id`s of deliveries.
pub fn delivered_ids(received: &[Value]) -> BTreeSet<String> {
    received.iter().map(|delivery| delivery["headers"]["webhook-id"].as_str().unwrap().to_owned()).collect()
}
