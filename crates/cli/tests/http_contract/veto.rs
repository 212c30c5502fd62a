//! Veto windows over HTTP: `agents put` checks the window, approvals show
//! `auto_approves_at`, extend moves it, a rejection before it is a veto.

use super::*;

fn seconds_between(a: &Value, b: &Value) -> i64 {
    let parse = |at: &Value| chrono::DateTime::parse_from_rfc3339(at.as_str().unwrap()).unwrap();
    (parse(b) - parse(a)).num_seconds()
}

pub(super) fn a_veto_window_is_shown_moved_by_extend_and_vetoed(target: Target) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(stand_in::StandIn::start());
    model.script(vec![
        stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        stand_in::text("Kept old."),
    ]);
    let server = Server::start_on(target, &[("AGENT_RUNS_AGENT_CACHE_SECS", "0")]);
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    let toml = support::janitor_definition(&model.url, "");
    let with_window = |secs: u64| {
        toml.replace("requires_approval = true", &format!("requires_approval = true\nauto_approve_after_secs = {secs}"))
    };
    std::fs::write(&file, with_window(30)).unwrap();
    let refused = server.admin_output(&["agents", "put", "--file", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("auto_approve_after_secs"), "{stderr}");
    std::fs::write(&file, with_window(600)).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);

    let run = server.create(&key, json!({"agent": "janitor", "input": "Delete old"}));
    let waiting = server.wait_for_status(&key, run["id"].as_str().unwrap(), "awaiting_approval");
    let approval = waiting["pending_approvals"][0].clone();
    assert_eq!(seconds_between(&approval["requested_at"], &approval["auto_approves_at"]), 600, "{approval}");
    assert!(seconds_between(&approval["auto_approves_at"], &approval["expires_at"]) >= 0, "{approval}");
    let inbox = server.get(&key, "/v1/approvals").expect_status(200).clone();
    assert_eq!(inbox["data"][0]["auto_approves_at"], approval["auto_approves_at"]);

    // The command line says when it approves by itself.
    let listed = std::process::Command::new(support::BIN)
        .args(["approvals", "list"])
        .env("AGENT_RUNS_URL", &server.base)
        .env("AGENT_RUNS_KEY", &key)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(", auto in 10m"), "{listed}");
    let path = format!("{}/approvals/{}", run_path(&waiting), approval["id"].as_str().unwrap());
    let extended = server.post(&key, &format!("{path}/extend"), json!({"seconds": 3600})).expect_status(200).clone();
    let moved = &extended["pending_approvals"][0];
    assert!(seconds_between(&approval["auto_approves_at"], &moved["auto_approves_at"]) >= 2_990, "{moved}");
    assert!(seconds_between(&moved["auto_approves_at"], &moved["expires_at"]) >= 0, "{moved}");

    let vetoed = json!({"decision": "reject", "comment": "keep it for the audit"});
    let decided = server.post(&key, &path, vetoed).expect_status(200).clone();
    assert_eq!(decided["pending_approvals"][0]["status"], "rejected");
    let done = server.wait_for_status(&key, run["id"].as_str().unwrap(), "succeeded");
    assert_eq!(done["output"], "Kept old.");
    assert!(model.tool_calls().is_empty(), "vetoed: never called");
}
