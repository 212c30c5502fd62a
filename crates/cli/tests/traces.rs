//! OpenTelemetry traces, as a collector receives them over OTLP: one trace
//! per run, with the request that created it, each attempt, model and tool
//! call, the approval wait and the decision in their places.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::otlp::{Collector, ReceivedSpan};
use support::{Server, Target};

const RUNS: &str = "/v1/agent/runs";

#[track_caller]
fn one<'a>(spans: &'a [ReceivedSpan], what: &str, test: impl Fn(&ReceivedSpan) -> bool) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|span| test(span)).collect();
    assert_eq!(found.len(), 1, "one {what} span in {spans:#?}");
    found[0]
}

/// Waits until `done` holds for the spans received, asking the API for
/// something now and then: on the Lambda target every function runs in
/// the one gateway process, whose flush after an invocation skips while
/// another is under way and leaves its spans to the next invocation (in
/// Lambda each function is a process of its own).
#[track_caller]
fn wait_for_spans(
    collector: &Collector,
    server: &Server,
    key: &str,
    done: impl Fn(&[ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let spans = collector.spans();
        if done(&spans) {
            return spans;
        }
        server.get(key, "/v1/agent/runs?limit=1");
        std::thread::sleep(Duration::from_millis(300));
    }
    collector.wait_for(Duration::ZERO, done)
}

fn a_run_with_an_approval_is_one_trace_with_its_spans_in_place(target: Target) {
    let collector = Collector::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let model = runtime.block_on(agent_runs_testkit::stand_in::StandIn::start());
    model.script(vec![
        agent_runs_testkit::stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        agent_runs_testkit::stand_in::text("Deleted old."),
    ]);
    let server = Server::start_on(
        target,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "runs-under-test"),
        ],
    );
    let key = server.dev_key.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("janitor.toml");
    std::fs::write(&file, support::janitor_definition(&model.url, "")).unwrap();
    server.admin(&["agents", "put", "--file", file.to_str().unwrap()]);

    let run = server.create(&key, json!({"agent": "janitor", "input": "Delete the branch old"}));
    let id = run["id"].as_str().unwrap();
    let trace_id = run["trace_id"].as_str().unwrap().to_owned();
    assert!(trace_id.len() == 32 && trace_id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')), "{run}");
    let other = server.create(&key, json!({"input": "x"}));
    assert_ne!(other["trace_id"], run["trace_id"], "a trace per run");
    let waiting = server.wait_for_status(&key, id, "awaiting_approval");
    let approval = &waiting["pending_approvals"][0];
    let decide = format!("{RUNS}/{id}/approvals/{}", approval["id"].as_str().unwrap());
    server.post(&key, &decide, json!({"decision": "approve"})).expect_status(200);
    let done = server.wait_for_status(&key, id, "succeeded");
    assert_eq!(done["trace_id"], trace_id.as_str(), "a run keeps its trace");
    // A list shows it, and so does the run inside its events: every
    // rendering of the run takes the deployment's choice.
    let listed = server.get(&key, RUNS);
    let entry = listed.body["data"].as_array().unwrap().iter().find(|entry| entry["id"] == id).unwrap().clone();
    assert_eq!(entry["trace_id"], trace_id.as_str(), "{entry}");
    let events = server.get(&key, &format!("{RUNS}/{id}/events"));
    let created = &events.body["data"][0];
    assert_eq!(
        (created["type"].as_str(), created["data"]["trace_id"].as_str()),
        (Some("run.created"), Some(trace_id.as_str()))
    );

    let in_trace = |spans: &[ReceivedSpan]| -> Vec<ReceivedSpan> {
        spans.iter().filter(|span| span.trace_id == trace_id).cloned().collect()
    };
    let spans = wait_for_spans(&collector, &server, &key, |spans| {
        in_trace(spans).iter().any(|span| span.name == "invoke_agent janitor")
    });
    let spans = in_trace(&spans);

    let create = one(&spans, "create request", |span| span.name == "POST /v1/agent/runs");
    assert_eq!((create.kind.as_str(), create.parent_span_id.as_str()), ("SPAN_KIND_SERVER", ""), "the trace's root");
    assert_eq!(create.attribute("http.response.status_code"), "201");
    assert_eq!(create.attribute("http.request.method"), "POST");
    assert_eq!(create.service_name, "runs-under-test");

    let whole = one(&spans, "run", |span| span.name == "invoke_agent janitor");
    assert_eq!(whole.parent_span_id, create.span_id, "the run is the create request's child");
    assert_eq!(whole.attribute("gen_ai.operation.name"), "invoke_agent");
    assert_eq!(whole.attribute("gen_ai.agent.name"), "janitor");
    assert_eq!(whole.attribute("agent_runs.run.id"), id);
    assert_eq!(whole.attribute("agent_runs.run.status"), "succeeded");
    assert_eq!(whole.attribute("gen_ai.usage.input_tokens"), "20");
    assert_eq!(whole.attribute("gen_ai.usage.output_tokens"), "10");
    assert!(whole.start_nanos <= create.end_nanos && whole.end_nanos >= whole.start_nanos);

    let attempts: Vec<&ReceivedSpan> = spans.iter().filter(|span| span.name == "run attempt").collect();
    assert_eq!(attempts.len(), 2, "before and after the approval: {spans:#?}");
    for attempt in &attempts {
        assert_eq!(attempt.parent_span_id, whole.span_id, "an attempt is the run's child");
    }
    let outcomes: Vec<&str> = attempts.iter().map(|span| span.attribute("agent_runs.attempt.outcome")).collect();
    assert!(outcomes.contains(&"awaiting_approval") && outcomes.contains(&"succeeded"), "{outcomes:?}");
    let first = attempts.iter().find(|span| span.attribute("agent_runs.attempt.outcome") == "awaiting_approval");
    let (first, second) =
        (first.unwrap(), attempts.iter().find(|span| span.attribute("agent_runs.attempt.outcome") == "succeeded"));
    let second = second.unwrap();

    let chats: Vec<&ReceivedSpan> = spans.iter().filter(|span| span.name == "chat stand-in-1").collect();
    assert_eq!(chats.len(), 2, "{spans:#?}");
    for chat in &chats {
        assert_eq!(chat.kind, "SPAN_KIND_CLIENT");
        assert_eq!(chat.attribute("gen_ai.operation.name"), "chat");
        assert_eq!(chat.attribute("gen_ai.provider.name"), "openai");
        assert_eq!(chat.attribute("gen_ai.request.model"), "stand-in-1");
        assert_eq!(
            (chat.attribute("gen_ai.usage.input_tokens"), chat.attribute("gen_ai.usage.output_tokens")),
            ("10", "5")
        );
    }
    let parents: Vec<&str> = chats.iter().map(|span| span.parent_span_id.as_str()).collect();
    assert!(parents.contains(&first.span_id.as_str()) && parents.contains(&second.span_id.as_str()), "{parents:?}");

    let tool = one(&spans, "tool", |span| span.name == "execute_tool delete_branch");
    assert_eq!(tool.parent_span_id, second.span_id, "the approved call is made in the second attempt");
    assert_eq!(tool.attribute("gen_ai.tool.name"), "delete_branch");
    assert_eq!(tool.attribute("gen_ai.tool.call.id"), "call_1");
    assert_eq!(tool.attribute("http.response.status_code"), "200");

    let wait = one(&spans, "approval wait", |span| span.name == "approval wait");
    assert_eq!(wait.parent_span_id, whole.span_id);
    assert_eq!(wait.attribute("agent_runs.approval.status"), "approved");
    assert_eq!(wait.attribute("agent_runs.approval.id"), approval["id"].as_str().unwrap());
    assert_eq!(wait.attribute("gen_ai.tool.name"), "delete_branch");
    assert!(wait.end_nanos > wait.start_nanos && wait.start_nanos >= first.start_nanos, "{wait:?}");

    let decided =
        one(&spans, "decide request", |span| span.name == "POST /v1/agent/runs/{run_id}/approvals/{approval_id}");
    assert_eq!(decided.parent_span_id, whole.span_id, "a change to the run is in its trace");
    assert_eq!(decided.attribute("http.response.status_code"), "200");
    assert!(
        !spans.iter().any(|span| span.name.starts_with("GET ")),
        "polling is not part of the run's trace: {spans:#?}"
    );
    assert!(spans.iter().all(|span| span.status != "STATUS_CODE_ERROR"), "{spans:#?}");
    assert_eq!(spans.len(), 9, "create, run, 2 attempts, 2 model calls, tool, wait, decision: {spans:#?}");

    // A create that carries the caller's `traceparent` joins the caller's
    // trace; a failed run's span says why.
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let header = format!("00-{caller_trace}-00f067aa0ba902b7-01");
    let traced =
        server.send(server.request("POST", RUNS).bearer_auth(&key).header("traceparent", header).json(&json!({
            "agent": "script", "input": "fail boom"
        })));
    let traced: Value = traced.expect_status(201).clone();
    assert_eq!(traced["trace_id"], caller_trace);
    server.wait_for_status(&key, traced["id"].as_str().unwrap(), "failed");
    let spans = wait_for_spans(&collector, &server, &key, |spans| {
        spans.iter().any(|span| span.trace_id == caller_trace && span.name == "invoke_agent script")
    });
    let create = one(&spans, "traced create", |span| span.trace_id == caller_trace && span.name.starts_with("POST"));
    assert_eq!(create.parent_span_id, "00f067aa0ba902b7", "the caller's span is the parent");
    let failed = one(&spans, "failed run", |span| span.trace_id == caller_trace && span.name == "invoke_agent script");
    assert_eq!((failed.status.as_str(), failed.attribute("error.type")), ("STATUS_CODE_ERROR", "run_failed"));
    assert_eq!(failed.parent_span_id, create.span_id);

    // A caller's unsampled trace is not recorded, though the run is in it:
    // not even a later change to the run (a cancel) that has no traceparent.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    let header = format!("00-{unsampled}-b7ad6b7169203331-00");
    let quiet = server.send(
        server
            .request("POST", RUNS)
            .bearer_auth(&key)
            .header("traceparent", header)
            .json(&json!({"agent": "script", "input": "approve x"})),
    );
    let quiet: Value = quiet.expect_status(201).clone();
    assert_eq!(quiet["trace_id"], unsampled);
    let quiet_id = quiet["id"].as_str().unwrap();
    server.wait_for_status(&key, quiet_id, "awaiting_approval");
    server.post(&key, &format!("{RUNS}/{quiet_id}/cancel"), json!({})).expect_status(200);
    // A request without a valid key makes no span, whatever trace it names.
    let nobody = "11111111111111111111111111111111";
    let header = format!("00-{nobody}-b7ad6b7169203331-01");
    server
        .send(server.request("GET", RUNS).bearer_auth("ark_wrong").header("traceparent", header))
        .expect_error(401, "unauthorized");
    // A malformed traceparent is ignored, as W3C Trace Context says.
    for header in ["00-00000000000000000000000000000000-00f067aa0ba902b7-01", "garbage", "00-abc-def-01"] {
        let reply = server.send(
            server.request("POST", RUNS).bearer_auth(&key).header("traceparent", header).json(&json!({"input": "x"})),
        );
        let trace = reply.expect_status(201)["trace_id"].as_str().unwrap().to_owned();
        assert!(trace.len() == 32 && trace != "0".repeat(32), "{header}: {trace}");
    }
    // A later sampled run's spans arriving means the earlier ones were sent.
    let later = server.create(&key, json!({"input": "y"}));
    let later_trace = later["trace_id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, later["id"].as_str().unwrap(), "succeeded");
    let spans = wait_for_spans(&collector, &server, &key, |spans| {
        spans.iter().any(|span| span.trace_id == later_trace && span.name == "invoke_agent echo")
    });
    assert!(!spans.iter().any(|span| span.trace_id == unsampled), "nothing of an unsampled trace");
    assert!(!spans.iter().any(|span| span.trace_id == nobody), "nothing of a request without a key");
}

/// Without an OTLP endpoint nothing is exported, and runs show exactly the
/// contract's keys (no `trace_id`); their log lines still carry one
/// (crates/service/tests/logging.rs).
#[test]
fn without_an_endpoint_runs_show_no_trace_id() {
    let server = Server::start();
    let key = server.dev_key.clone().unwrap();
    let run = server.create(&key, json!({"input": "x"}));
    assert!(run.get("trace_id").is_none(), "{run}");
    assert_eq!(run.as_object().unwrap().len(), 14, "{run}");
}

mod embedded {
    #[test]
    fn a_run_with_an_approval_is_one_trace_with_its_spans_in_place() {
        super::a_run_with_an_approval_is_one_trace_with_its_spans_in_place(super::Target::Embedded)
    }
}

mod lambda {
    #[test]
    fn a_run_with_an_approval_is_one_trace_with_its_spans_in_place() {
        if crate::support::without_emulator("lambda::a_run_with_an_approval_is_one_trace_with_its_spans_in_place") {
            return;
        }
        super::a_run_with_an_approval_is_one_trace_with_its_spans_in_place(super::Target::Lambda)
    }
}
