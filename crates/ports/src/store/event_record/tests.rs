use super::*;
use crate::views::event_data_json;
use agent_runs_domain::{
    ApprovalId, Effect, ExecutionPolicy, KeyId, Owner, PolicyMatch, ProposedCall, Resolver, RuleMode, Run, RunId,
    RunTrace, Usage,
};

fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(1_795_303_478_000 + millis)
}

fn approval(n: u128, call: bool) -> Approval {
    Approval {
        id: ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
        action: if call { "Call deploy".into() } else { "é".repeat(3_000) },
        call: call
            .then(|| ProposedCall { tool: "deploy".into(), arguments: serde_json::json!({"env": "prod", "n": 1e21}) }),
        status: ApprovalStatus::Approved,
        requested_at: at(1),
        resolved_at: Some(at(2)),
        comment: Some("ok".into()),
        expires_at: Some(at(3)),
        expiry_warned: true,
        resolved_by: Some(Resolver::Key(KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 9)))),
        edited_arguments: call.then(|| serde_json::json!({"env": "staging"})),
        policy: None,
        input_schema: None,
        answer: None,
        tool_changed: false,
        auto_approves_at: None,
    }
}

/// A question a person answered.
fn question() -> Approval {
    Approval {
        status: ApprovalStatus::Answered,
        input_schema: Some(serde_json::json!({"enum": ["staging", "prod"]})),
        answer: Some(serde_json::json!("prod")),
        ..approval(5, false)
    }
}

/// A call a rule decided.
fn by_policy() -> Approval {
    let policy = PolicyMatch { rule: "small".into(), effect: Effect::Deny, mode: RuleMode::Enforce, version: 3 };
    Approval { resolved_by: Some(Resolver::Policy("small".into())), policy: Some(policy), ..approval(4, true) }
}

/// A run with something in every field an event shows.
fn run() -> Run {
    let id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    let metadata = [("ticket".to_owned(), "OPS-1".to_owned())].into();
    let mut run = Run::new(
        id,
        Owner::parse("acme").unwrap(),
        "ops".into(),
        "x".repeat(5_000),
        metadata,
        &ExecutionPolicy::default(),
    )
    .created_by(KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 7)))
    .with_trace(RunTrace { trace_id: 0xabc, span_id: 1, parent_span_id: None, sampled: true })
    .with_budget(agent_runs_domain::Budget { max_total_tokens: Some(100), max_tool_calls: None });
    run.status = RunStatus::Succeeded;
    run.output = Some("done".into());
    run.started_at = Some(at(1));
    run.completed_at = Some(at(4));
    run.usage = Some(Usage { input_tokens: 3, output_tokens: 4, total_tokens: 7, tool_calls: 1 });
    run.approvals = vec![approval(2, true), approval(3, false), by_policy(), question()];
    run
}

fn every_kind() -> Vec<EventData> {
    let snapshot = || Box::new(RunSnapshot::of(&run()));
    let text = EventText::new(&"y".repeat(5_000));
    vec![
        EventData::RunCreated(snapshot()),
        EventData::RunStarted { attempt: 2 },
        EventData::RunAwaitingApproval { approval_ids: vec![approval(2, true).id, approval(3, false).id] },
        EventData::RunResumed,
        EventData::RunRequeued,
        EventData::RunSucceeded(snapshot()),
        EventData::RunFailed(Box::new(RunSnapshot { error: Some(EventText::new("boom")), ..*snapshot() })),
        EventData::RunCanceled(snapshot()),
        EventData::ApprovalRequested(approval(2, true)),
        EventData::ApprovalDecided(question()),
        EventData::ApprovalExpiring(approval(3, false)),
        EventData::ApprovalExtended(approval(3, false)),
        EventData::ApprovalExpired(approval(3, false)),
        EventData::ApprovalCanceled(by_policy()),
        EventData::OutputAppended { text: text.clone() },
        EventData::ModelResponded {
            text: text.clone(),
            tool_calls: vec!["deploy".into()],
            usage: Some(Usage { input_tokens: 1, output_tokens: 2, total_tokens: 3, tool_calls: 0 }),
        },
        EventData::ToolCompleted(Box::new(ToolCompleted {
            tool: "deploy".into(),
            arguments: serde_json::json!({"env": "prod"}),
            http_status: None,
            duration_ms: 12,
            result: text,
            mcp_server: Some("github".into()),
            policy: Some(PolicyMatch {
                rule: "watch".into(),
                effect: agent_runs_domain::Effect::Deny,
                mode: agent_runs_domain::RuleMode::LogOnly,
                version: 3,
            }),
        })),
        EventData::ContextTruncated { dropped_turns: 3, dropped_bytes: 12_345 },
    ]
}

/// Every event reads back as it was written, and clients get from the
/// read exactly what its data renders to, whatever the deployment shows.
#[test]
fn every_kind_reads_back_and_renders_as_written() {
    let all = every_kind();
    assert_eq!(all.iter().map(EventData::kind).collect::<Vec<_>>(), agent_runs_domain::EVENT_TYPES);
    for data in all {
        let kind = data.kind();
        let body = EventBody::written(&data, EventFormat::Record, ExtraFields::default());
        assert_eq!(body.format(), EVENT_FORMAT);
        assert_eq!(body.decode(kind).unwrap().as_ref(), Some(&data), "{kind}");
        for trace_ids in [false, true] {
            let shown = ExtraFields { trace_ids };
            assert_eq!(body.render(kind, shown).unwrap(), event_data_json(&data, shown), "{kind}");
            // Rendered at write, as a deploy over an older release writes.
            let rendered = EventBody::written(&data, EventFormat::Rendered, shown);
            assert_eq!((rendered.format(), rendered.decode(kind).unwrap()), (RENDERED_FORMAT, None));
            assert_eq!(rendered.render(kind, ExtraFields::default()).unwrap(), event_data_json(&data, shown), "{kind}");
        }
    }
}

/// The event that ends a run fits a store's item (DynamoDB's 400 KB)
/// whatever its texts: 50 approvals of the longest questions and
/// comments, in control characters (six bytes each in JSON), the
/// longest input and metadata. A run with few approvals keeps their
/// texts whole.
#[test]
fn the_event_that_ends_a_run_fits_an_item_whatever_its_texts() {
    let control = |chars: usize| "\u{1}".repeat(chars);
    let mut run = run();
    run.input = control(64 * 1024);
    run.output = Some(control(64 * 1024));
    run.metadata = (0..16).map(|key| (format!("{key:0>64}"), control(512))).collect();
    run.approvals = (0..50)
        .map(|n| Approval {
            action: control(agent_runs_domain::MAX_QUESTION_CHARS),
            comment: Some(control(1_000)),
            ..if n % 2 == 0 { question() } else { approval(n, true) }
        })
        .collect();
    let ended = EventData::RunSucceeded(Box::new(RunSnapshot::of(&run)));
    for format in [EventFormat::Record, EventFormat::Rendered] {
        let stored = EventBody::written(&ended, format, ExtraFields { trace_ids: true }).text().len();
        assert!(stored < 300_000, "{stored} bytes");
    }
    let shown: serde_json::Value = serde_json::from_str(&event_data_json(&ended, ExtraFields::default())).unwrap();
    let first = &shown["pending_approvals"][0];
    assert_eq!((shown["truncated"].as_bool(), &first["answer"]), (Some(true), &serde_json::Value::Null));
    assert_eq!(first["action"].as_str().map(str::len), Some(agent_runs_domain::SHORT_APPROVAL_TEXT_BYTES));

    run.approvals.truncate(3);
    let whole: serde_json::Value = serde_json::from_str(&event_data_json(
        &EventData::RunSucceeded(Box::new(RunSnapshot::of(&run))),
        ExtraFields::default(),
    ))
    .unwrap();
    assert_eq!(whole["pending_approvals"][0]["action"].as_str().map(str::len), Some(2_000));
    assert_eq!(whole["pending_approvals"][0]["answer"], "prod");
    assert_eq!(whole["pending_approvals"][0]["comment"].as_str().map(str::len), Some(1_000));
}

/// The stored format is this text: changing it must be a new format.
#[test]
fn the_stored_format_is_fixed() {
    let data = EventData::RunCanceled(Box::new(RunSnapshot {
        approvals: vec![],
        input: EventText::new("hi"),
        output: None,
        ..RunSnapshot::of(&run())
    }));
    let stored = r#"{"id":"run_01M806T4VB0000000000000001","status":"succeeded","agent":"ops","input":{"text":"hi"},"output":null,"error":null,"approvals":[],"metadata":{"ticket":"OPS-1"},"created_by":"key_01M806T4VB0000000000000007","created_at":1795303478123,"started_at":1795303478001,"completed_at":1795303478004,"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7,"tool_calls":1},"budget":{"max_total_tokens":100},"trace_id":"00000000000000000000000000000abc"}"#;
    assert_eq!(encode_event(&data), stored);
    // A question in a run keeps its schema and answer; a record
    // written before they were kept reads them as none.
    let asked = EventData::RunCanceled(Box::new(RunSnapshot {
        approvals: vec![ApprovalSummary::of(&question())],
        ..RunSnapshot::of(&run())
    }));
    let kept = r#","input_schema":{"enum":["staging","prod"]},"answer":"prod"}"#;
    let stored = encode_event(&asked);
    assert!(stored.contains(kept), "{stored}");
    let before = EventBody::stored(EVENT_FORMAT, stored.replace(kept, "}"));
    let shown = before.render("run.canceled", ExtraFields::default()).unwrap();
    assert!(shown.contains(r#""input_schema":null,"answer":null"#), "{shown}");
    let approval = encode_event(&EventData::ApprovalDecided(approval(2, true)));
    assert_eq!(
        approval,
        r#"{"id":"apr_01M806T4VB0000000000000002","action":"Call deploy","status":"approved","requested_at":1795303478001,"resolved_at":1795303478002,"comment":"ok","expires_at":1795303478003,"expiry_warned":true,"resolved_by":"key_01M806T4VB0000000000000009","tool":"deploy","arguments":"{\"env\":\"prod\",\"n\":1e+21}","edited_arguments":"{\"env\":\"staging\"}"}"#
    );
}

#[test]
fn events_from_before_the_record_are_shown_as_they_were_written() {
    let json = r#"{"text":"old","truncated":false}"#;
    let body = EventBody::stored(RENDERED_FORMAT, json.to_owned());
    assert_eq!(body.render("output.appended", ExtraFields { trace_ids: true }).unwrap(), json);
}

#[test]
fn a_record_that_does_not_read_back_is_a_defect() {
    let cases = [
        (3, "output.appended", r#"{"text":"a"}"#),
        (EVENT_FORMAT, "output.appended", r#"{"txt":"a"}"#),
        (EVENT_FORMAT, "run.paused", "{}"),
        (EVENT_FORMAT, "run.awaiting_approval", r#"{"approval_ids":["nope"]}"#),
        (EVENT_FORMAT, "approval.decided", r#"{"id":"apr_x"}"#),
    ];
    for (format, kind, text) in cases {
        let body = EventBody::stored(format, text.to_owned());
        assert!(matches!(body.render(kind, ExtraFields::default()), Err(StoreError::Defect(_))), "{kind} {text}");
    }
}
