//! Durability of the embedded server: kill -9 at any moment loses no
//! accepted run, and after a restart every run reaches a terminal state (or
//! keeps waiting for its approval).

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::Server;

const FAST: &[(&str, &str)] =
    &[("AGENT_RUNS_WORKERS", "2"), ("AGENT_RUNS_LEASE_MS", "1500"), ("AGENT_RUNS_SWEEP_MS", "100")];

fn id(run: &Value) -> String {
    run["id"].as_str().unwrap().to_owned()
}

#[test]
fn kill_9_while_runs_are_queued_running_and_awaiting_then_restart() {
    let server = Server::start_with(FAST);
    let key = server.dev_key.clone().unwrap();
    let sleepers: Vec<String> =
        (0..2).map(|i| id(&server.create_script(&key, &format!("say s{i}\nsleep 1500\nsay done {i}")))).collect();
    for sleeper in &sleepers {
        server.wait_for_status(&key, sleeper, "running");
    }
    let waiting = id(&server.create_script(&key, "approve Restart survived\nsay after"));
    let queued: Vec<String> = (0..5).map(|i| id(&server.create(&key, json!({"input": format!("q{i}")})))).collect();
    for run in &queued {
        assert_eq!(server.get(&key, &format!("/v1/agent/runs/{run}")).body["status"], "queued");
    }

    let server = server.crash_and_restart();
    assert!(server.dev_key.is_none(), "the restarted server keeps its keys");

    for (i, run) in queued.iter().enumerate() {
        let done = server.wait_for_status(&key, run, "succeeded");
        assert_eq!(done["output"], format!("q{i}"));
    }
    for (i, run) in sleepers.iter().enumerate() {
        let done = server.wait_for(&key, run, Duration::from_secs(30), |run| run["status"] == "succeeded");
        assert_eq!(done["output"], format!("s{i}\ndone {i}"));
    }
    // The approval waits for its human, across the crash.
    let run = server.wait_for_status(&key, &waiting, "awaiting_approval");
    let approval = run["pending_approvals"][0]["id"].as_str().unwrap();
    server
        .post(&key, &format!("/v1/agent/runs/{waiting}/approvals/{approval}"), json!({"decision": "approve"}))
        .expect_status(200);
    let done = server.wait_for_status(&key, &waiting, "succeeded");
    assert_eq!(done["output"], "approved: Restart survived\nafter");
    let listed = server.get(&key, "/v1/agent/runs?limit=100").body["data"].as_array().unwrap().len();
    assert_eq!(listed, 8, "every accepted run is still there");
}

#[test]
fn a_run_whose_worker_keeps_dying_is_failed_after_its_last_attempt() {
    let mut env = FAST.to_vec();
    env.push(("AGENT_RUNS_MAX_ATTEMPTS", "1"));
    let server = Server::start_with(&env);
    let key = server.dev_key.clone().unwrap();
    let run = id(&server.create_script(&key, "sleep 60000"));
    server.wait_for_status(&key, &run, "running");
    let server = server.crash_and_restart();
    let failed = server.wait_for(&key, &run, Duration::from_secs(20), |run| run["status"] == "failed");
    assert!(failed["error"].as_str().unwrap().contains("attempts"), "{failed}");
    assert!(failed["completed_at"].is_string());
}

#[test]
fn sigterm_hands_running_runs_back_so_a_restart_resumes_them_at_once() {
    // A long lease: the run can only finish quickly if it was handed back.
    let server = Server::start_with(&[("AGENT_RUNS_LEASE_MS", "600000"), ("AGENT_RUNS_SWEEP_MS", "100")]);
    let key = server.dev_key.clone().unwrap();
    let run = id(&server.create_script(&key, "say one\nsleep 1000\nsay two"));
    server.wait_for_status(&key, &run, "running");
    let server = server.terminate_and_restart();
    let done = server.wait_for(&key, &run, Duration::from_secs(15), |run| run["status"] == "succeeded");
    assert_eq!(done["output"], "one\ntwo");
}
