//! MCP servers as tools, against a server made with the official Python
//! SDK (`infra/mcp_test_server.py`, `mcp` from PyPI) over Streamable HTTP:
//! offered to the model as `<server>__<tool>`, gated by annotations, the
//! server's approval mode, policies and pins, and called once with exactly
//! the arguments approved.

use agent_runs_agents::llm::{EnvLookup, LlmRuntime, pin};
use agent_runs_domain::{KeyId, McpServerDefinition, parse_rules};
use agent_runs_ports::store::PolicyStore;
use agent_runs_testkit::mcp_server::McpServer;

use super::*;

fn env() -> EnvLookup {
    Arc::new(|name| (name == "ISSUES_TOKEN").then(|| "Bearer issues-token".to_owned()))
}

/// The fixture's agent with the server `issues` (and no HTTP tools but
/// the stand-in's), pinned as `agents put` pins it unless `pinned` is false.
async fn fixture_with(server: &McpServer, entry: Value, pinned: bool) -> Fixture {
    let fixture = Fixture::with(|definition| definition["mcp_servers"] = json!([entry]), 256 * 1024).await;
    let mut agent = fixture.store.get_agent("ops").await.unwrap().unwrap();
    if pinned {
        let runtime = LlmRuntime::new(env(), 256 * 1024);
        let http = runtime.tool_http(true);
        let listed = pin(&mut agent.mcp_servers[0], &http, &env()).await.unwrap();
        assert_eq!(listed.len(), 4, "{listed:?}");
        fixture.store.put_agent(&agent, Timestamp::from_millis(1)).await.unwrap();
    }
    assert_eq!(agent.mcp_servers[0].url, server.url());
    fixture
}

fn issues(server: &McpServer) -> Value {
    json!({
        "name": "issues",
        "url": server.url(),
        "headers_from_env": {"Authorization": "ISSUES_TOKEN"},
        "tools": ["list_issues", "close_issue", "tracker_status"],
        "timeout_ms": 10000
    })
}

fn call(id: &str, tool: &str, arguments: Value) -> Turn {
    tool_call(id, tool, &arguments.to_string())
}

fn offered(fixture: &Fixture, request: usize) -> Vec<String> {
    let tools = fixture.stand_in.model_requests()[request]["tools"].clone();
    tools.as_array().unwrap().iter().map(|tool| tool["function"]["name"].as_str().unwrap().to_owned()).collect()
}

async fn decide(fixture: &Fixture, message: &RunMessage, index: usize, decision: Decision) {
    let mut run = fixture.run(message).await;
    let approval = run.approvals[index].id;
    let request = DecisionRequest { decision, comment: None, seen_sha256: None, decided_by: None };
    run.decide(approval, request, fixture.clock.now(), &fixture.policy).unwrap();
    fixture.store.update(&mut run).await.unwrap();
}

async fn read_only_tool_runs_without_a_person(flags: &[&str]) {
    let server = McpServer::start(flags);
    let fixture = fixture_with(&server, issues(&server), true).await;
    fixture
        .stand_in
        .script(vec![call("call_1", "issues__list_issues", json!({"repo": "acme/app"})), text("Two issues are open.")]);
    let message = fixture.create("What is open?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    let offered = offered(&fixture, 0);
    for tool in ["issues__list_issues", "issues__close_issue", "issues__tracker_status"] {
        assert!(offered.contains(&tool.to_owned()), "{offered:?}");
    }
    assert!(!offered.iter().any(|tool| tool.contains("delete_repo")), "the allow-list hides it: {offered:?}");
    let tools = fixture.stand_in.model_requests()[0]["tools"].clone();
    let listed = tools.as_array().unwrap().iter().find(|tool| tool["function"]["name"] == "issues__list_issues");
    let schema = &listed.unwrap()["function"]["parameters"];
    assert_eq!(schema["required"], json!(["repo"]), "the server's input schema: {schema}");

    let result = messages(&fixture, 1).last().unwrap().clone();
    assert_eq!(result["role"], "tool");
    assert!(result["content"].as_str().unwrap().contains("#1 flaky test"), "{result}");
    assert_eq!(server.calls(), [("list_issues".to_owned(), json!({"repo": "acme/app"}))]);
    let received = &server.received()[0];
    assert_eq!(received["authorization"], "Bearer issues-token", "headers_from_env: {received}");
    assert_eq!(received["receipt"], Value::Null, "no approval, no receipt");
    // The newest version with a handshake, never the SDK's draft; a server
    // that speaks only the 2026-07-28 protocol (no handshake) gets that.
    let version = if flags.contains(&"--modern-only") { "2026-07-28" } else { "2025-11-25" };
    assert_eq!(received["protocol_version"], version, "{received}");
    // The client declares no sampling, elicitation or roots: the server may ask nothing of it.
    if flags.is_empty() {
        assert!(received["capabilities"].is_object(), "declared in the handshake: {received}");
    }
    let capabilities = received["capabilities"].as_object().cloned().unwrap_or_default();
    for refused in ["sampling", "elicitation", "roots"] {
        assert!(!capabilities.contains_key(refused), "{received}");
    }
    let run = fixture.run(&message).await;
    assert!(run.approvals.is_empty());
    assert_eq!(run.usage.map(|usage| usage.tool_calls), Some(1));
    let completed: Vec<Value> = events(&fixture, &message)
        .await
        .into_iter()
        .filter(|(kind, _)| kind == "tool.completed")
        .map(|e| e.1)
        .collect();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0]["tool"], "issues__list_issues");
    assert_eq!(completed[0]["mcp_server"], "issues");
    assert_eq!(completed[0]["arguments"], json!({"repo": "acme/app"}));
    assert!(completed[0]["result"].as_str().unwrap().contains("#2 typo"), "{}", completed[0]);
}

#[tokio::test]
async fn a_read_only_tool_of_a_server_that_keeps_sessions_runs_without_a_person() {
    read_only_tool_runs_without_a_person(&[]).await;
}

#[tokio::test]
async fn a_read_only_tool_of_a_stateless_server_runs_without_a_person() {
    read_only_tool_runs_without_a_person(&["--stateless"]).await;
}

/// A server of the 2026-07-28 protocol only, which refuses `initialize`
/// (400, -32020): the client discovers it instead.
#[tokio::test]
async fn a_read_only_tool_of_a_server_without_a_handshake_runs_without_a_person() {
    read_only_tool_runs_without_a_person(&["--modern-only"]).await;
}

#[tokio::test]
async fn a_destructive_tool_asks_and_is_called_once_as_approved_or_edited() {
    let server = McpServer::start(&[]);
    let fixture = fixture_with(&server, issues(&server), true).await;
    fixture.stand_in.script(vec![
        call("call_1", "issues__close_issue", json!({"number": 1, "comment": "fixed"})),
        call("call_2", "issues__close_issue", json!({"number": 3})),
        text("Closed #1 and #4."),
    ]);
    let message = fixture.create("Close what is fixed").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    let approval = &run.approvals[0];
    assert_eq!(approval.call.as_ref().unwrap().tool, "issues__close_issue");
    assert!(!approval.tool_changed);
    assert!(server.calls().is_empty(), "nothing is called before a person decides");
    decide(&fixture, &message, 0, Decision::Approve).await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    decide(&fixture, &message, 1, Decision::Edit(json!({"number": 4, "comment": "duplicate"}))).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);

    assert_eq!(
        server.calls(),
        [
            ("close_issue".to_owned(), json!({"number": 1, "comment": "fixed"})),
            ("close_issue".to_owned(), json!({"number": 4, "comment": "duplicate"})),
        ]
    );
    let told = messages(&fixture, 2).last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(told.contains("changed the arguments") && told.contains("closed #4"), "{told}");
    // Each call carried its receipt: for the server's URL and its own name of the tool.
    let run = fixture.run(&message).await;
    for (received, (approval, decision)) in server.received().iter().zip(run.approvals.iter().zip(["approve", "edit"]))
    {
        let claims = super::receipts::claims(received["receipt"].as_str().unwrap());
        assert_eq!(
            (claims["aud"].as_str(), claims["tool"].as_str()),
            (Some(server.url().as_str()), Some("close_issue"))
        );
        assert_eq!((claims["mcp_server"].as_str(), claims["decision"].as_str()), (Some("issues"), Some(decision)));
        assert_eq!(claims["sub"], approval.id.to_string());
        let sent = agent_runs_domain::canonical_json(&received["arguments"]);
        assert_eq!(claims["arguments_sha256"], agent_runs_domain::sha256_hex(sent.as_bytes()));
    }
    assert_eq!(fixture.run(&message).await.usage.map(|usage| usage.tool_calls), Some(2));
}

#[tokio::test]
async fn a_tool_error_is_told_to_the_model_as_a_failed_call() {
    let server = McpServer::start(&[]);
    let fixture = fixture_with(&server, issues(&server), true).await;
    fixture.stand_in.script(vec![call("call_1", "issues__tracker_status", json!({})), text("The tracker is down.")]);
    let message = fixture.create("Is the tracker up?").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let told = messages(&fixture, 1).last().unwrap()["content"].as_str().unwrap().to_owned();
    assert!(told.contains("reported an error") && told.contains("down for maintenance"), "{told}");
    assert_eq!(server.calls().len(), 1);
}

#[tokio::test]
async fn always_asks_even_for_read_only_tools_and_never_asks_for_none() {
    let server = McpServer::start(&[]);
    let always = json!({"require_approval": "always", "name": "issues", "url": server.url()});
    let fixture = fixture_with(&server, always, true).await;
    fixture.stand_in.script(vec![call("call_1", "issues__list_issues", json!({"repo": "a/b"})), text("Done.")]);
    let message = fixture.create("List").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    assert!(server.calls().is_empty());
    assert!(offered(&fixture, 0).contains(&"issues__delete_repo".to_owned()), "no allow-list: every tool");

    let never = json!({"require_approval": "never", "name": "issues", "url": server.url()});
    let fixture = fixture_with(&server, never, true).await;
    fixture.stand_in.script(vec![call("call_1", "issues__close_issue", json!({"number": 9})), text("Done.")]);
    let message = fixture.create("Close").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert!(fixture.run(&message).await.approvals.is_empty());
    assert_eq!(server.calls(), [("close_issue".to_owned(), json!({"number": 9, "comment": ""}))]);
}

#[tokio::test]
async fn a_tool_changed_after_pinning_asks_whatever_rules_and_annotations_say() {
    let mut server = McpServer::start(&[]);
    let fixture = fixture_with(&server, issues(&server), true).await;
    // The owner allows every tool of the server.
    let rules =
        parse_rules(&json!({"rules": [{"id": "trust-issues", "tool": "issues__*", "effect": "allow"}]})).unwrap();
    let key = KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    fixture.store.put_policy(&Owner::parse("acme").unwrap(), None, &rules, fixture.clock.now(), key).await.unwrap();
    server.restart(&["--changed"]);
    fixture.stand_in.script(vec![reply_with_two_calls(), text("Listed, and closed #2.")]);
    let message = fixture.create("Tidy up").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    let run = fixture.run(&message).await;
    // The unchanged tool is allowed by the rule; the changed one (a
    // read-only tool, allowed by a rule) asks, and says why.
    assert_eq!(run.approvals.len(), 2);
    let by_tool = |tool: &str| run.approvals.iter().find(|a| a.call.as_ref().unwrap().tool == tool).unwrap().clone();
    let changed = by_tool("issues__list_issues");
    assert!(changed.tool_changed);
    assert_eq!((changed.status, changed.policy.as_ref()), (ApprovalStatus::Pending, None));
    let allowed = by_tool("issues__close_issue");
    assert!(!allowed.tool_changed);
    assert_eq!(allowed.status, ApprovalStatus::Approved);
    assert_eq!(allowed.resolved_by.as_ref().map(ToString::to_string).as_deref(), Some("policy:trust-issues"));

    // `agents put` again re-pins: the read-only tool runs without a person.
    let mut agent = fixture.store.get_agent("ops").await.unwrap().unwrap();
    pin(&mut agent.mcp_servers[0], &LlmRuntime::new(env(), 1 << 20).tool_http(true), &env()).await.unwrap();
    fixture.store.put_agent(&agent, Timestamp::from_millis(2)).await.unwrap();
    fixture.stand_in.script(vec![call("call_9", "issues__list_issues", json!({"repo": "a/b"})), text("Listed.")]);
    let message = fixture.create("List").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert!(fixture.run(&message).await.approvals.is_empty());
    assert_eq!(server.calls(), [("list_issues".to_owned(), json!({"repo": "a/b"}))]);
}

fn reply_with_two_calls() -> Turn {
    stand_in::reply(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "issues__list_issues", "arguments": "{\"repo\":\"a/b\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "issues__close_issue", "arguments": "{\"number\":2}"}}
    ]}))
}

/// The server changes a tool after the call was judged (a read-only call
/// waiting behind another's approval): the call is not made; a person is
/// asked about it, `tool_changed: true`, and only then is it made.
#[tokio::test]
async fn a_tool_changed_between_judging_and_calling_is_put_to_a_person() {
    let mut server = McpServer::start(&[]);
    let fixture = fixture_with(&server, issues(&server), true).await;
    fixture.stand_in.script(vec![reply_with_two_calls(), text("Done.")]);
    let message = fixture.create("Tidy up").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    assert_eq!(fixture.run(&message).await.approvals.len(), 1, "only close_issue asks");
    server.restart(&["--changed"]);
    decide(&fixture, &message, 0, Decision::Approve).await;
    let outcome = fixture.process(&message).await;
    assert_eq!(outcome, Outcome::AwaitingApproval, "{:?}", fixture.run(&message).await.error);
    assert!(server.calls().is_empty(), "the changed tool was not called");
    let run = fixture.run(&message).await;
    let asked = &run.approvals[1];
    assert_eq!(asked.call.as_ref().unwrap().tool, "issues__list_issues");
    assert_eq!(asked.call.as_ref().unwrap().arguments, json!({"repo": "a/b"}));
    assert!(asked.tool_changed && asked.status == ApprovalStatus::Pending);
    decide(&fixture, &message, 1, Decision::Approve).await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    assert_eq!(
        server.calls(),
        [
            ("list_issues".to_owned(), json!({"repo": "a/b"})),
            ("close_issue".to_owned(), json!({"number": 2, "comment": ""})),
        ]
    );
}

#[tokio::test]
async fn a_server_never_pinned_has_every_tool_ask() {
    let server = McpServer::start(&[]);
    let fixture = fixture_with(&server, issues(&server), false).await;
    fixture.stand_in.script(vec![call("call_1", "issues__list_issues", json!({"repo": "a/b"})), text("Done.")]);
    let message = fixture.create("List").await;
    let outcome = fixture.process(&message).await;
    assert_eq!(outcome, Outcome::AwaitingApproval, "{:?}", fixture.run(&message).await.error);
    assert!(fixture.run(&message).await.approvals[0].tool_changed);
}

/// A server that cannot be used fails the run, naming it, within its
/// `timeout_ms`: nothing listening, a listener that never answers, a
/// redirect (never followed), a private address without the opt-in.
#[tokio::test]
async fn a_server_that_cannot_be_used_fails_the_run_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let redirect = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let redirect_port = redirect.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = redirect.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer).await;
            let answer =
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/mcp\r\nContent-Length: 0\r\n\r\n";
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    // A server that refuses the handshake says how: credentials (401) are
    // not a protocol mismatch (400).
    let mut refusing = Vec::new();
    for status in ["401 Unauthorized", "400 Bad Request"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        refusing.push(listener.local_addr().unwrap().port());
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer).await;
                let body = "Missing MCP-Protocol-Version header";
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
    }
    let cases = [
        (format!("http://127.0.0.1:{}/mcp", refusing[0]), true, "refused our credentials (HTTP 401)"),
        (format!("http://127.0.0.1:{}/mcp", refusing[1]), true, "answered the MCP handshake with HTTP 400"),
        (format!("http://127.0.0.1:{closed}/mcp"), true, "could not be reached"),
        (format!("http://127.0.0.1:{silent_port}/mcp"), true, "did not answer within 700 ms"),
        (format!("http://127.0.0.1:{redirect_port}/mcp"), true, "could not be"),
        ("https://127.0.0.1:9/mcp".to_owned(), false, "private or local network"),
    ];
    for (url, allow_private_network, expected) in cases {
        let entry = json!({"name": "tracker", "url": url, "timeout_ms": 700});
        let fixture = Fixture::with(
            |definition| {
                definition["mcp_servers"] = json!([entry]);
                definition["allow_private_network"] = json!(allow_private_network);
                if !allow_private_network {
                    definition["tools"] = json!([]);
                }
            },
            256 * 1024,
        )
        .await;
        fixture.stand_in.script(vec![text("never asked")]);
        let message = fixture.create("Go").await;
        let started = std::time::Instant::now();
        assert_eq!(fixture.process(&message).await, Outcome::Failed, "{url}");
        assert!(started.elapsed() < Duration::from_secs(5), "{url}: {:?}", started.elapsed());
        let error = fixture.run(&message).await.error.unwrap();
        assert!(error.contains("MCP server `tracker`") && error.contains(expected), "{url}: {error}");
        assert!(fixture.stand_in.model_requests().is_empty(), "the model is not asked without its tools");
    }
}

#[test]
fn an_mcp_server_entry_reads_as_the_contract_writes_it() {
    let entry: McpServerDefinition = toml::from_str(
        r#"
name = "github"
url = "https://mcp.example.com/mcp"
headers_from_env = { Authorization = "GITHUB_MCP_TOKEN" }
tools = ["list_issues", "close_issue"]
require_approval = "unless_read_only"
timeout_ms = 30000
"#,
    )
    .unwrap();
    assert_eq!(entry.tool_name("close_issue"), "github__close_issue");
    assert!(entry.offers("close_issue") && !entry.offers("delete_repo"));
}
