//! MCP servers as tools, through the CLI and the API: `agents put` pins the
//! server's tools, a read-only tool runs alone, a destructive one waits for
//! a person and is called once.

use agent_runs_testkit::mcp_server::McpServer;

use super::*;

fn definition(model: &str, server: &McpServer, settings: &str) -> String {
    format!(
        r#"name = "triage"
provider = "openai"
model = "stand-in-1"
base_url = "{model}/v1"
system_prompt = "You triage issues."
{settings}

[[mcp_servers]]
name = "issues"
url = "{url}"
headers_from_env = {{ Authorization = "ISSUES_TOKEN" }}
tools = ["list_issues", "close_issue"]
"#,
        url = server.url()
    )
}

pub(super) fn an_mcp_server_is_pinned_by_the_cli_and_its_tools_are_gated(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(stand_in::StandIn::start());
    let mcp = McpServer::start(&[]);
    model.script(vec![
        stand_in::tool_call("call_1", "issues__list_issues", r#"{"repo":"acme/app"}"#),
        stand_in::tool_call("call_2", "issues__close_issue", r#"{"number":2,"comment":"typo fixed"}"#),
        stand_in::text("Closed #2."),
    ]);
    let env = [("AGENT_RUNS_AGENT_CACHE_SECS", "0"), ("ISSUES_TOKEN", "Bearer issues-token")];
    let server = Server::start_on(target, &env);
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("triage.toml");

    // An http:// server without the opt-in: refused, naming the field.
    std::fs::write(&file, definition(&model.url, &mcp, "")).unwrap();
    let refused = server.admin_output(&["agents", "put", "--file", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("mcp_servers[0].url"), "{stderr}");

    std::fs::write(&file, definition(&model.url, &mcp, "allow_private_network = true")).unwrap();
    let put = server.admin_output(&["agents", "put", "--file", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&put.stderr);
    assert!(put.status.success(), "{stderr}");
    assert!(stderr.contains("Pinned 4 tools of MCP server `issues`"), "{stderr}");
    assert!(stderr.contains("issues__close_issue (approval)") && !stderr.contains("delete_repo"), "{stderr}");
    let listed = server.admin(&["agents", "list"]);
    assert!(
        listed.lines().any(|line| line.starts_with("triage") && line.contains("issues__* (MCP, 4 pinned)")),
        "{listed}"
    );
    let shown: Value = serde_json::from_str(&server.admin(&["agents", "get", "triage"])).unwrap();
    assert_eq!(shown["mcp_servers"][0]["pinned"].as_object().unwrap().len(), 4, "{shown}");

    let run = server.create(&key, json!({"agent": "triage", "input": "Tidy the tracker"}));
    let id = run["id"].as_str().unwrap();
    let waiting = server.wait_for_status(&key, id, "awaiting_approval");
    let approval = &waiting["pending_approvals"][0];
    assert_eq!(approval["tool"], "issues__close_issue");
    assert_eq!(approval["arguments"], json!({"number": 2, "comment": "typo fixed"}));
    assert_eq!(approval["tool_changed"], false);
    assert_eq!(mcp.calls().len(), 1, "the read-only tool ran without a person: {:?}", mcp.calls());

    let path = format!("{}/approvals/{}", run_path(&waiting), approval["id"].as_str().unwrap());
    // An edit is checked by the server's schema when the call is made; here
    // only that it is an object.
    server.post(&key, &path, json!({"decision": "edit", "arguments": ["x"]})).expect_error(400, "invalid_request");
    let edit = json!({"decision": "edit", "arguments": {"number": 3, "comment": "duplicate of #2"}});
    server.post(&key, &path, edit).expect_status(200);
    let done = server.wait_for_status(&key, id, "succeeded");
    assert_eq!(done["output"], "Closed #2.");
    assert_eq!(
        mcp.calls(),
        [
            ("list_issues".to_owned(), json!({"repo": "acme/app"})),
            ("close_issue".to_owned(), json!({"number": 3, "comment": "duplicate of #2"})),
        ]
    );
    let events = server.get(&key, &format!("{}/events", run_path(&done))).expect_status(200).clone();
    let completed: Vec<&Value> =
        events["data"].as_array().unwrap().iter().filter(|event| event["type"] == "tool.completed").collect();
    assert_eq!(completed.len(), 2);
    assert!(completed.iter().all(|event| event["data"]["mcp_server"] == "issues"), "{completed:?}");
    assert_eq!(completed[1]["data"]["result"], "closed #3");
}
