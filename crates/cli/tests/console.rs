//! The web console: its files and headers over HTTP on both ways of
//! serving, and its use in a real browser (headless Chromium driven by
//! Selenium, infra/console_test.py) against `agent-runs serve`.

mod support;

use std::process::Command;

use serde_json::{Value, json};
use support::{Server, Target};

fn console_files_are_served_without_a_key_with_a_strict_policy(target: Target) {
    let server = Server::start_on(target, &[]);
    for (path, content_type) in [
        ("/console", "text/html; charset=utf-8"),
        ("/console/console.js", "text/javascript; charset=utf-8"),
        ("/console/answers.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
    ] {
        let response = reqwest::blocking::get(format!("{}{path}", server.base)).unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let header = |name: &str| response.headers().get(name).map(|value| value.to_str().unwrap().to_owned());
        assert_eq!(header("content-type").as_deref(), Some(content_type), "{path}");
        let policy = header("content-security-policy").unwrap();
        assert!(policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"), "{policy}");
        assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"), "{policy}");
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"));
        assert_eq!(header("x-content-type-options").as_deref(), Some("nosniff"));
    }
    let page = reqwest::blocking::get(format!("{}/console", server.base)).unwrap().text().unwrap();
    assert!(!page.contains("<script>") && !page.contains("style="), "no inline script or style");
    // Every module the page loads, followed from its one entry through the
    // imports, is served (a file missing from the asset table fails here),
    // is type-checked, and reads API text with textContent, never as HTML.
    assert!(page.contains(r#"<script type="module" src="console/console.js"></script>"#), "{page}");
    let (mut todo, mut seen) = (vec!["console.js".to_owned()], std::collections::BTreeSet::new());
    while let Some(file) = todo.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        let response = reqwest::blocking::get(format!("{}/console/{file}", server.base)).unwrap();
        assert_eq!(response.status(), 200, "{file}");
        let script = response.text().unwrap();
        assert!(script.starts_with("// @ts-check"), "{file}");
        assert!(!script.contains("innerHTML") && !script.contains("insertAdjacentHTML") && !script.contains("eval("));
        todo.extend(script.split(r#"from "./"#).skip(1).map(|rest| rest.split('"').next().unwrap().to_owned()));
    }
    assert!(seen.len() >= 10, "{seen:?}");
    let client = reqwest::blocking::Client::new();
    let refused = client.post(format!("{}/console", server.base)).send().unwrap();
    assert_eq!(refused.status(), 405);
    // The addresses a person types lead to the console; the root stays an
    // unknown path to a client with a key; the icon is served.
    let no_redirects =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    for (path, location) in [("/", "console"), ("/console/", "../console")] {
        let response = no_redirects.get(format!("{}{path}", server.base)).send().unwrap();
        assert_eq!(response.status(), 307, "{path}");
        assert_eq!(response.headers()["location"], location, "{path}");
    }
    let key = server.dev_key.clone().unwrap();
    let root = no_redirects.get(format!("{}/", server.base)).bearer_auth(&key).send().unwrap();
    assert_eq!(root.status(), 404);
    let icon = reqwest::blocking::get(format!("{}/favicon.ico", server.base)).unwrap();
    assert_eq!((icon.status().as_u16(), icon.headers()["content-type"].to_str().unwrap()), (200, "image/svg+xml"));
}

#[test]
fn embedded_console_files_are_served_without_a_key_with_a_strict_policy() {
    console_files_are_served_without_a_key_with_a_strict_policy(Target::Embedded);
}

#[test]
fn lambda_console_files_are_served_without_a_key_with_a_strict_policy() {
    if support::without_emulator("lambda_console_files_are_served_without_a_key_with_a_strict_policy") {
        return;
    }
    console_files_are_served_without_a_key_with_a_strict_policy(Target::Lambda);
}

/// The schema of the question the browser test answers: every kind of
/// field the console's form makes.
fn question_schema() -> Value {
    json!({"type": "object", "properties": {
        "env": {"enum": ["staging", "prod"]},
        "count": {"type": "integer", "minimum": 1},
        "notes": {"type": "string", "maxLength": 500},
        "urgent": {"type": "boolean"},
        "priority": {"enum": [1, 2, 3]}
    }, "required": ["env", "count"]})
}

#[test]
fn a_person_decides_in_the_console_in_a_real_browser() {
    let Some(python) = std::env::var_os("AGENT_RUNS_TEST_BROWSER_PYTHON") else {
        eprintln!(
            "skipped a_person_decides_in_the_console_in_a_real_browser: it needs Chromium and Selenium; `bash infra/test.sh` installs them and runs it"
        );
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(agent_runs_testkit::stand_in::StandIn::start());
    // Turns in the order the runs ask: the tool run, the two-call run, then
    // each once its approvals are decided.
    let first_arguments = r#"{"branch":"first","retries":2.0,"tiny":1.5e-300,"ratio":0.5e-6}"#;
    model.script(vec![
        agent_runs_testkit::stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        agent_runs_testkit::stand_in::reply(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "delete_branch", "arguments": first_arguments}},
            {"id": "call_b", "type": "function", "function": {"name": "delete_branch", "arguments": r#"{"branch":"second"}"#}},
        ]})),
        agent_runs_testkit::stand_in::tool_call("call_q", "ask_human", &json!({"question": "Where, and how many?", "answer_schema": question_schema()}).to_string()),
        agent_runs_testkit::stand_in::text("Deleted."),
        agent_runs_testkit::stand_in::text("Both deleted."),
        agent_runs_testkit::stand_in::text("Noted."),
        agent_runs_testkit::stand_in::text("No tags need tidying."),
        // A run of an agent that wants a second person, made by the browser's key.
        agent_runs_testkit::stand_in::tool_call("call_g", "delete_branch", r#"{"branch":"guarded"}"#),
    ]);
    let server = Server::start_on(Target::Embedded, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0")]);
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    // Its calls have a veto window of an hour: shown, and vetoed by Reject.
    let definition = support::janitor_definition(&model.url, "ask_human = true")
        .replace("requires_approval = true", "requires_approval = true\nauto_approve_after_secs = 3600");
    std::fs::write(&file, definition).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);
    let guarded =
        support::janitor_definition(&model.url, "separate_approver = true").replace("\"janitor\"", "\"guarded\"");
    std::fs::write(&file, guarded).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);

    let script_run =
        server.create_script(&key, "approve Deploy <script>alert(1)</script><img src=x onerror=alert(1)> v2");
    let tool_run = server.create(&key, json!({"agent": "janitor", "input": "Delete the old branch"}));
    let reject_run = server.create_script(&key, "approve Archive the logs");
    let id = |run: &Value| run["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &id(&tool_run), "awaiting_approval");
    let two_calls_run = server.create(&key, json!({"agent": "janitor", "input": "Delete two branches"}));
    server.wait_for_status(&key, &id(&two_calls_run), "awaiting_approval");
    let question_run = server.create(&key, json!({"agent": "janitor", "input": "Ask before deploying"}));
    for run in [&script_run, &reject_run, &question_run] {
        server.wait_for_status(&key, &id(run), "awaiting_approval");
    }
    let reader = server.admin(&["keys", "create", "--owner", "dev", "--name", "reader", "--scope", "runs:read"]);
    let reader = reader.trim().to_owned();
    // Screenshots of the main screens (docs/console-*.png are copies of them).
    let shots = env!("CARGO_TARGET_TMPDIR");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra/console_test.py");
    let output = Command::new(python)
        .args([
            script,
            &server.base,
            &key,
            &reader,
            &id(&script_run),
            &id(&tool_run),
            &id(&reject_run),
            &id(&two_calls_run),
            &id(&question_run),
            shots,
        ])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the browser test failed:\n{said}");
    eprintln!("{said}screenshots in {shots}");

    // What the person did in the browser is what the service recorded.
    let approved = server.wait_for_status(&key, &id(&script_run), "succeeded");
    assert_eq!(approved["output"], "approved: Deploy <script>alert(1)</script><img src=x onerror=alert(1)> v2");
    let edited = server.wait_for_status(&key, &id(&tool_run), "succeeded");
    assert_eq!(edited["pending_approvals"][0]["edited_arguments"], json!({"branch": "older"}));
    let calls = model.tool_calls();
    assert_eq!(serde_json::from_str::<Value>(&calls[0].body).unwrap(), json!({"branch": "older"}));
    // Of two calls waiting at once, the one picked was approved by `a`; the
    // other, approved with its editor untouched (as proposed, not an edit),
    // reached its tool as the very text its digest covers.
    let both = server.wait_for_status(&key, &id(&two_calls_run), "succeeded");
    let approvals = both["pending_approvals"].as_array().unwrap();
    assert_eq!(approvals[1]["arguments"]["branch"], "second");
    assert_eq!(approvals[1]["edited_arguments"], Value::Null, "decided by `a`, not edited: {both}");
    assert_eq!(approvals[0]["edited_arguments"], Value::Null, "untouched: approved as proposed: {both}");
    assert_eq!(approvals[0]["arguments"], json!({"branch": "first", "ratio": 5e-7, "retries": 2, "tiny": 1.5e-300}));
    let bodies: Vec<&str> = calls.iter().skip(1).map(|call| call.body.as_str()).collect();
    assert_eq!(bodies, [r#"{"branch":"first","ratio":5e-7,"retries":2,"tiny":1.5e-300}"#, r#"{"branch":"second"}"#]);
    // The answer the form made is the one recorded, and the model read it.
    let answered = server.wait_for_status(&key, &id(&question_run), "succeeded");
    assert_eq!(
        answered["pending_approvals"][0]["answer"],
        json!({"env": "prod", "count": 2, "urgent": true, "priority": 2})
    );
    let requests = model.model_requests();
    let last_message = |request: &Value| request["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(last_message(&requests[requests.len() - 3]), r#"{"count":2,"env":"prod","priority":2,"urgent":true}"#);
    // The run continued in the console: its model saw the conversation, then the new input.
    let continued = &requests[requests.len() - 2];
    assert_eq!(last_message(continued), "Any tags to tidy too?");
    assert_eq!(continued["messages"][1]["content"], tool_run["input"], "{continued}");
    assert_eq!(last_message(requests.last().unwrap()), "Delete the guarded branch", "asked last, never decided");
    let rejected = server.wait_for_status(&key, &id(&reject_run), "succeeded");
    assert_eq!(rejected["pending_approvals"][0]["comment"], "not today");
    assert_eq!(rejected["output"], "rejected: Archive the logs");
}
