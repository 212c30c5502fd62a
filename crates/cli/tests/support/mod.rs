//! Starts the real `agent-runs` binary on an ephemeral port with a fresh
//! database, and talks to it over HTTP: black-box, as a client would.

#![allow(dead_code)]

pub mod events;
pub mod otlp;
pub mod receiver;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, RequestBuilder};
use reqwest::header::HeaderMap;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-runs");

/// The ways of serving the contract that the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `agent-runs serve`: SQLite, in-process queue and workers.
    Embedded,
    /// `agent-runs gateway`: the Lambda handlers fed API Gateway v2 and SQS
    /// events, on DynamoDB and SQS in the AWS API emulator.
    Lambda,
}

pub struct Server {
    child: Child,
    pub base: String,
    pub dir: tempfile::TempDir,
    pub dev_key: Option<String>,
    pub target: Target,
    env: Vec<(String, String)>,
    client: Client,
}

/// The emulator's endpoint, started by infra/test.sh.
pub fn aws_endpoint() -> String {
    std::env::var("AGENT_RUNS_TEST_AWS_ENDPOINT").expect(
        "AGENT_RUNS_TEST_AWS_ENDPOINT is not set: run the tests with `bash infra/test.sh`, which starts the AWS API emulator",
    )
}

/// `true`, after a line saying how to run it, when the AWS API emulator is
/// not there: the calling test then returns at once, so a plain `cargo
/// test` passes on a machine without it. `bash infra/test.sh` starts the
/// emulator and runs every test.
pub fn without_emulator(test: &str) -> bool {
    if std::env::var_os("AGENT_RUNS_TEST_AWS_ENDPOINT").is_some() {
        return false;
    }
    eprintln!("skipped {test}: it needs the AWS API emulator; `bash infra/test.sh` starts one and runs every test");
    true
}

/// The environment of a process that talks to the emulator.
pub fn aws_env() -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", aws_endpoint()),
        ("AWS_REGION", "us-east-1".into()),
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_EC2_METADATA_DISABLED", "true".into()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// SDK configuration for the emulator, without touching the process environment.
pub async fn aws_sdk_config() -> aws_config::SdkConfig {
    let credentials = aws_sdk_dynamodb::config::Credentials::new("testing", "testing", None, None, "tests");
    agent_runs_platform::aws_sdk::sdk_config_loader()
        .endpoint_url(aws_endpoint())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(credentials)
        .load()
        .await
}

fn unique_prefix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("t{}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed), nanos % 100_000)
}

/// Creates a fresh table and queues from template.yaml with `agent-runs
/// aws-setup`; returns the variables naming them.
pub fn create_aws_resources() -> Vec<(String, String)> {
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let output = Command::new(BIN)
        .args(["aws-setup", "--template", template, "--prefix", &unique_prefix()])
        .envs(aws_env())
        .stdin(Stdio::null())
        .output()
        .expect("run agent-runs aws-setup");
    assert!(output.status.success(), "aws-setup: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

impl Server {
    pub fn start() -> Server {
        Self::start_on(Target::Embedded, &[])
    }

    pub fn start_with(env: &[(&str, &str)]) -> Server {
        Self::start_on(Target::Embedded, env)
    }

    /// Starts a server of `target` with extra environment (for example a
    /// short lease), on a fresh database or fresh AWS resources.
    pub fn start_on(target: Target, env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut full_env: Vec<(String, String)> = Vec::new();
        if target == Target::Lambda {
            full_env.extend(aws_env());
            full_env.extend(create_aws_resources());
            full_env.push(("AGENT_RUNS_SWEEP_MS".into(), "1000".into()));
        }
        full_env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut server = Self::spawn(target, dir, full_env);
        if target == Target::Lambda {
            server.dev_key = Some(server.key("dev"));
        }
        server
    }

    fn db(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("data").join("runs.db")
    }

    fn spawn(target: Target, dir: tempfile::TempDir, env: Vec<(String, String)>) -> Server {
        let mut command = Command::new(BIN);
        match target {
            Target::Embedded => command.args(["serve", "--addr", "127.0.0.1:0", "--db"]).arg(Self::db(&dir)),
            Target::Lambda => command.args(["gateway", "--addr", "127.0.0.1:0"]),
        };
        command.env("AGENT_RUNS_LOG", "warn").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (name, value) in &env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("start agent-runs");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut dev_key = None;
        let base = loop {
            let line = lines_rx.recv_timeout(Duration::from_secs(30)).expect("server prints its address");
            if let Some(key) = line.trim().strip_prefix("export AGENT_RUNS_KEY=") {
                dev_key = Some(key.to_owned());
            }
            if let Some(rest) = line.strip_prefix("Listening on ") {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        let client = http_client().timeout(Duration::from_secs(30)).build().unwrap();
        Server { child, base, dir, dev_key, target, env, client }
    }

    /// Kills the process with SIGKILL (no shutdown) and starts it again on
    /// the same database.
    pub fn crash_and_restart(mut self) -> Server {
        self.child.kill().expect("kill -9");
        self.child.wait().unwrap();
        self.restart()
    }

    /// Stops the process with SIGTERM, waits for its graceful exit, and
    /// starts it again on the same database.
    pub fn terminate_and_restart(mut self) -> Server {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
        self.restart()
    }

    fn restart(mut self) -> Server {
        let dir = tempfile::TempDir::new().unwrap();
        let old_dir = std::mem::replace(&mut self.dir, dir);
        let env = std::mem::take(&mut self.env);
        let target = self.target;
        drop(self);
        Self::spawn(target, old_dir, env)
    }

    /// Runs `agent-runs <args> --db <this server's database>` and returns stdout.
    pub fn admin(&self, args: &[&str]) -> String {
        let output = self.admin_output(args);
        assert!(output.status.success(), "agent-runs {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    /// Runs `agent-runs <args> --db <this server's database>`, which may fail.
    pub fn admin_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .arg("--db")
            .arg(Self::db(&self.dir))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .expect("run agent-runs")
    }

    /// Issues a key for `owner` with the admin command.
    pub fn key(&self, owner: &str) -> String {
        self.admin(&["keys", "create", "--owner", owner]).trim().to_owned()
    }

    pub fn request(&self, method: &str, path: &str) -> RequestBuilder {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        self.client.request(method, format!("{}{path}", self.base))
    }

    /// Sends and checks what every response must have.
    #[track_caller]
    pub fn send(&self, request: RequestBuilder) -> Reply {
        let response = request.send().expect("request sent");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().unwrap();
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "every response is JSON: {status} {text}"
        );
        let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(!request_id.is_empty(), "every response has an x-request-id");
        let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("JSON body: {text}"));
        Reply { status, headers, body }
    }

    #[track_caller]
    pub fn get(&self, key: &str, path: &str) -> Reply {
        self.send(self.request("GET", path).bearer_auth(key))
    }

    #[track_caller]
    pub fn post(&self, key: &str, path: &str, body: Value) -> Reply {
        self.send(self.request("POST", path).bearer_auth(key).json(&body))
    }

    #[track_caller]
    pub fn create(&self, key: &str, body: Value) -> Value {
        self.post(key, "/v1/agent/runs", body).expect_status(201).clone()
    }

    #[track_caller]
    pub fn create_script(&self, key: &str, script: &str) -> Value {
        self.create(key, serde_json::json!({"agent": "script", "input": script}))
    }

    /// Polls the run until `done` holds for it, or panics after `timeout`.
    #[track_caller]
    pub fn wait_for(&self, key: &str, id: &str, timeout: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let run = self.get(key, &format!("/v1/agent/runs/{id}")).expect_status(200).clone();
            if done(&run) {
                return run;
            }
            assert!(Instant::now() < deadline, "run {id} did not get there in {timeout:?}: {run}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[track_caller]
    pub fn wait_for_status(&self, key: &str, id: &str, status: &str) -> Value {
        self.wait_for(key, id, Duration::from_secs(20), |run| run["status"] == status)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `2026-11-21T23:24:38.123Z`
pub fn is_timestamp(value: &Value) -> bool {
    let Some(text) = value.as_str() else { return false };
    let bytes = text.as_bytes();
    bytes.len() == 24
        && bytes[23] == b'Z'
        && bytes[10] == b'T'
        && bytes[19] == b'.'
        && text.chars().enumerate().all(|(i, c)| match i {
            4 | 7 => c == '-',
            10 => c == 'T',
            13 | 16 => c == ':',
            19 => c == '.',
            23 => c == 'Z',
            _ => c.is_ascii_digit(),
        })
}

pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// Asserts the contract's error shape and returns the body's `error`.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> &Value {
        assert_eq!(self.status, status, "expected {status} {code}, got {}: {}", self.status, self.body);
        let error = &self.body["error"];
        assert_eq!(error["code"], code, "body: {}", self.body);
        let message = error["message"].as_str().expect("error.message is a string");
        assert!(!message.is_empty());
        error
    }

    #[track_caller]
    pub fn expect_status(&self, status: u16) -> &Value {
        assert_eq!(self.status, status, "body: {}", self.body);
        &self.body
    }
}

/// reqwest's TLS (compiled in for the agents' providers) needs the crypto
/// provider the AWS SDK also uses.
pub fn http_client() -> reqwest::blocking::ClientBuilder {
    agent_runs_platform::aws_sdk::use_ring_for_rustls();
    Client::builder()
}

/// A defined agent `janitor` on the stand-in provider at `url`, with one
/// tool that needs approval; `settings` are more top-level lines.
pub fn janitor_definition(url: &str, settings: &str) -> String {
    format!(
        r#"name = "janitor"
provider = "openai"
model = "stand-in-1"
base_url = "{url}/v1"
system_prompt = "You keep the repository tidy."
allow_private_network = true   # the stand-in's tool listens on 127.0.0.1
{settings}

[[tools]]
name = "delete_branch"
description = "Deletes a branch."
method = "POST"
url = "{url}/tools/delete"
requires_approval = true
parameters = {{ type = "object", properties = {{ branch = {{ type = "string" }} }}, required = ["branch"] }}
"#
    )
}
