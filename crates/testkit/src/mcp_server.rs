//! The tests' MCP server (`infra/mcp_test_server.py`), made with the
//! official Python SDK (`mcp` from PyPI), which `bash infra/test.sh`
//! installs into the Python named by `AGENT_RUNS_TEST_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The Python MCP server on a port of its own; killed when dropped.
pub struct McpServer {
    child: Child,
    port: u16,
    calls: PathBuf,
    _dir: tempfile::TempDir,
}

impl McpServer {
    pub fn start(flags: &[&str]) -> McpServer {
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls.jsonl");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut server = McpServer { child: Self::spawn(port, &calls, flags), port, calls, _dir: dir };
        server.wait_until_listening();
        server
    }

    fn spawn(port: u16, calls: &Path, flags: &[&str]) -> Child {
        let python = std::env::var("AGENT_RUNS_TEST_PYTHON")
            .expect("AGENT_RUNS_TEST_PYTHON names a Python with the `mcp` package (bash infra/test.sh sets it up)");
        Command::new(python)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/mcp_test_server.py"))
            .arg(port.to_string())
            .arg(calls)
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the MCP test server")
    }

    fn wait_until_listening(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(self.child.try_wait().unwrap().is_none(), "the MCP test server exited");
            assert!(std::time::Instant::now() < deadline, "the MCP test server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The same server (same URL) started again with other flags.
    pub fn restart(&mut self, flags: &[&str]) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.child = Self::spawn(self.port, &self.calls, flags);
        self.wait_until_listening();
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Every call the server received: (tool, arguments).
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.received()
            .into_iter()
            .map(|call| (call["tool"].as_str().unwrap().to_owned(), call["arguments"].clone()))
            .collect()
    }

    /// Every call as the server recorded it, with what the client sent.
    pub fn received(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.calls).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str::<Value>(line).unwrap()).collect()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
