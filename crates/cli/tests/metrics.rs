//! `agent-runs serve --metrics-addr`: Prometheus text at /metrics, counted
//! from what the runs' writes committed.

mod support;

use support::{Server, Target};

fn value(text: &str, series: &str) -> f64 {
    let line = text.lines().find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '));
    line.unwrap_or_else(|| panic!("no {series} in\n{text}")).rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn serve_counts_runs_outcomes_and_waits_on_its_metrics_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let server = Server::start_on(
        Target::Embedded,
        &[("AGENT_RUNS_METRICS_ADDR", &addr), ("AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", "true")],
    );
    let key = server.dev_key.clone().unwrap();
    // An endpoint nothing listens on, for failed runs: one failed attempt.
    let hook = serde_json::json!({"url": "http://127.0.0.1:1/hook", "events": ["run.failed"]});
    server.post(&key, "/v1/webhooks", hook).expect_status(201);
    let echo = server.create(&key, serde_json::json!({"input": "hello"}));
    server.wait_for_status(&key, echo["id"].as_str().unwrap(), "succeeded");
    let asking = server.create_script(&key, "approve Ship it");
    let id = asking["id"].as_str().unwrap();
    let waiting = server.wait_for_status(&key, id, "awaiting_approval");
    let decide = format!("/v1/agent/runs/{id}/approvals/{}", waiting["pending_approvals"][0]["id"].as_str().unwrap());
    server.post(&key, &decide, serde_json::json!({"decision": "approve"})).expect_status(200);
    server.wait_for_status(&key, id, "succeeded");
    let failing = server.create_script(&key, "fail boom");
    server.wait_for_status(&key, failing["id"].as_str().unwrap(), "failed");

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let webhook_failed = r#"agent_runs_webhook_deliveries_total{result="failed"}"#;
    while value(&reqwest::blocking::get(format!("http://{addr}/metrics")).unwrap().text().unwrap(), webhook_failed)
        < 1.0
    {
        assert!(std::time::Instant::now() < deadline, "the failed webhook attempt is counted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let response = reqwest::blocking::get(format!("http://{addr}/metrics")).unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    let text = response.text().unwrap();
    assert_eq!(value(&text, "agent_runs_created_total"), 3.0);
    assert_eq!(value(&text, r#"agent_runs_finished_total{outcome="succeeded"}"#), 2.0);
    assert_eq!(value(&text, r#"agent_runs_finished_total{outcome="failed"}"#), 1.0);
    assert_eq!(value(&text, "agent_runs_queue_wait_seconds_count"), 3.0);
    assert_eq!(value(&text, "agent_runs_execution_seconds_count"), 3.0);
    assert_eq!(value(&text, "agent_runs_approval_wait_seconds_count"), 1.0);
    assert_eq!(value(&text, r#"agent_runs_approval_wait_seconds_bucket{le="+Inf"}"#), 1.0);
    assert_eq!(value(&text, r#"agent_runs_webhook_deliveries_total{result="delivered"}"#), 0.0);
    // The API's own address does not serve them (401 without a key, as any
    // unknown path), and other paths of the metrics address are 404.
    let api = reqwest::blocking::get(format!("{}/metrics", server.base)).unwrap();
    assert_eq!(api.status(), 401);
    assert_eq!(reqwest::blocking::get(format!("http://{addr}/other")).unwrap().status(), 404);
}
