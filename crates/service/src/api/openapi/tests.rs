use std::collections::BTreeSet;

use super::*;
use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{ExecutionPolicy, Owner, Run, RunId};
use agent_runs_ports::views::RunView;
use agent_runs_testkit::approvals::pending_approval;

fn builtin() -> Value {
    let agents = AgentRegistry::builtin("echo").unwrap();
    document(&agents.names_list(), agents.default_name())
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

fn required(schema: &Value) -> BTreeSet<String> {
    schema["required"].as_array().unwrap().iter().map(|key| key.as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let committed: Value = serde_json::from_str(include_str!("../../../../../docs/openapi.json")).unwrap();
    assert!(
        committed == builtin(),
        "docs/openapi.json is out of date: run `cargo run -p agent-runs -- openapi > docs/openapi.json`"
    );
}

#[test]
fn the_run_and_approval_schemas_have_exactly_the_keys_the_handlers_send() {
    let id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    let mut run = Run::new(
        id,
        Owner::parse("acme").unwrap(),
        "echo".into(),
        "x".into(),
        Default::default(),
        &ExecutionPolicy::default(),
    );
    run.approvals.push(pending_approval());
    let view = serde_json::to_value(RunView::new(&run, agent_runs_ports::views::ExtraFields::default())).unwrap();
    let schemas = &builtin()["components"]["schemas"];
    assert_eq!(keys(&view), required(&schemas["Run"]));
    // A run whose model reported tokens has `usage` too, and one created
    // with a budget `budget`; both are optional.
    run.usage = Some(Default::default());
    run.budget = agent_runs_domain::Budget { max_total_tokens: Some(5), max_tool_calls: None };
    let with_usage = serde_json::to_value(RunView::new(&run, agent_runs_ports::views::ExtraFields::default())).unwrap();
    // `trace_id` is there when traces are exported (tests/traces.rs).
    let mut optional = keys(&with_usage);
    assert!(optional.insert("trace_id".into()));
    assert_eq!(optional, keys(&schemas["Run"]["properties"]));
    assert_eq!(keys(&with_usage["usage"]), required(&schemas["Run"]["properties"]["usage"]));
    assert_eq!(keys(&view["pending_approvals"][0]), required(&schemas["Approval"]));
    let pattern = schemas["Run"]["properties"]["created_at"]["pattern"].as_str().unwrap();
    assert_eq!(pattern, TIMESTAMP);
    assert_eq!(view["created_at"].as_str().unwrap().len(), 24);
}

#[test]
fn every_error_code_and_status_filter_is_listed() {
    let document = builtin();
    let codes = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"];
    assert_eq!(codes.as_array().unwrap().len(), 13);
    let statuses = &document["paths"]["/v1/agent/runs"]["get"]["parameters"][0]["schema"]["enum"];
    assert_eq!(statuses.as_array().unwrap().len(), RunStatus::ALL.len() + 1, "the six states and empty");
    let agents = &document["components"]["schemas"]["CreateRun"]["properties"]["agent"]["examples"];
    assert_eq!(agents, &json!(["echo", "script"]));
}
