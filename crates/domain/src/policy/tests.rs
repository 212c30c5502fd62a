use super::*;
use crate::policy_replay::{DecidedCall, HumanDecision, ReplayStopped, RuleTally, replay};

fn rules(rules: Value) -> Vec<Rule> {
    parse_rules(&json!({ "rules": rules })).unwrap()
}

fn refused(rules: Value) -> RuleError {
    parse_rules(&json!({ "rules": rules })).unwrap_err()
}

fn call<'a>(tool: &'a str, arguments: &'a Value) -> GatedCall<'a> {
    GatedCall { agent: "janitor", tool, arguments, requires_approval: true, always_ask: false }
}

fn policy(rules_json: Value) -> Policy {
    Policy { version: 4, rules: rules(rules_json), ..Policy::default() }
}

#[test]
fn rules_read_back_with_every_default_filled_in() {
    let read = rules(json!([{"id": "a", "effect": "allow"}]));
    assert_eq!(
        rules_json(&read),
        json!([{"id": "a", "agent": "*", "tool": "*", "effect": "allow", "mode": "enforce", "reason": null, "when": []}])
    );
    let full = json!([{"id": "small-deletes", "agent": "jan?tor", "tool": "delete_*", "effect": "deny",
        "mode": "log_only", "reason": "no", "when": [{"path": "/count", "op": "<=", "value": 3.0}]}]);
    assert_eq!(rules_from_json(&rules_json(&rules(full.clone()))).unwrap(), rules(full));
}

#[test]
fn malformed_rules_name_the_rule_and_the_field() {
    let cases = [
        (json!([{"id": "a", "effect": "allow"}, {"id": "b", "effect": "maybe"}]), Some(1), "rules[1].effect"),
        (json!([{"id": "a", "effect": "allow", "colour": 1}]), Some(0), "rules[0].colour"),
        (json!([{"id": "a", "effect": "allow"}, {"id": "a", "effect": "deny"}]), Some(1), "rules[1].id"),
        (json!([{"id": "a b", "effect": "allow"}]), Some(0), "rules[0].id"),
        (json!([{"id": "Upper", "effect": "allow"}]), Some(0), "rules[0].id"),
        (json!([{"id": "-lead", "effect": "allow"}]), Some(0), "rules[0].id"),
        (json!([{"id": "x".repeat(64), "effect": "allow"}]), Some(0), "rules[0].id"),
        (json!([{"effect": "allow"}]), Some(0), "rules[0].id"),
        (json!([{"id": "a", "effect": "allow", "mode": "dry"}]), Some(0), "rules[0].mode"),
        (json!([{"id": "a", "effect": "allow", "tool": ""}]), Some(0), "rules[0].tool"),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "~", "value": 1}]}]),
            Some(0),
            "rules[0].when[0].op",
        ),
        (json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "~"}]}]), Some(0), "rules[0].when[0].op"),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "=="}]}]),
            Some(0),
            "rules[0].when[0].value",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "<", "value": "1"}]}]),
            Some(0),
            "rules[0].when[0].value",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "in", "value": 1}]}]),
            Some(0),
            "rules[0].when[0].value",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "matches", "value": "("}]}]),
            Some(0),
            "rules[0].when[0].value",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "exists", "value": "yes"}]}]),
            Some(0),
            "rules[0].when[0].value",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "n", "op": "==", "value": 1}]}]),
            Some(0),
            "rules[0].when[0].path",
        ),
        (
            json!([{"id": "a", "effect": "allow", "when": [{"path": "/n", "op": "==", "value": 1, "x": 2}]}]),
            Some(0),
            "rules[0].when[0].x",
        ),
        (json!([{"id": "a", "effect": "allow", "when": {}}]), Some(0), "rules[0].when"),
        (json!([{"id": "a", "effect": "allow", "when": null}]), Some(0), "rules[0].when"),
        (json!([{"id": "a", "effect": "allow", "tool": null}]), Some(0), "rules[0].tool"),
        (json!({}), None, "rules"),
    ];
    for (rules, index, param) in cases {
        let error = refused(rules.clone());
        assert_eq!((error.index, error.param.as_str()), (index, param), "{rules}: {error}");
    }
    let many: Vec<Value> = (0..=MAX_RULES).map(|n| json!({"id": format!("r{n}"), "effect": "ask"})).collect();
    assert_eq!(refused(Value::Array(many)).param, "rules");
    let long = json!([{"id": "a", "effect": "ask", "reason": "x".repeat(400)}]);
    let big: Vec<Value> =
        (0..180).map(|n| json!({"id": format!("r{n}"), "effect": "ask", "reason": "x".repeat(400)})).collect();
    assert!(parse_rules(&json!({"rules": long})).is_ok());
    assert_eq!(refused(Value::Array(big)).param, "rules", "over 64 KiB");
    assert_eq!(parse_rules(&json!({"rules": [], "extra": 1})).unwrap_err().param, "extra");
    assert_eq!(parse_rules(&json!([])).unwrap_err().param, "body");
}

/// A pattern whose compiled form would blow up is refused, not run.
#[test]
fn patterns_that_blow_up_are_refused() {
    let huge = json!([{"id": "a", "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "(a{1,1000}){1,1000}"}]}]);
    assert!(refused(huge).message.contains("too large"));
    // No text closes the anchoring group: refused, not a looser pattern.
    let escaping = json!([{"id": "a", "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "a)|(b"}]}]);
    assert_eq!(refused(escaping).param, "rules[0].when[0].value");
    let anchored =
        rules(json!([{"id": "a", "effect": "deny", "when": [{"path": "/s", "op": "matches", "value": "a|b"}]}]));
    assert!(
        anchored[0].matches(&call("t", &json!({"s": "b"}))) && !anchored[0].matches(&call("t", &json!({"s": "ab"})))
    );
    // A document's patterns are bounded in number.
    let many: Vec<Value> = (0..=MAX_MATCHES_CONDITIONS)
        .map(|n| json!({"id": format!("m{n}"), "effect": "ask", "when": [{"path": "/s", "op": "matches", "value": "x"}]}))
        .collect();
    assert_eq!(refused(Value::Array(many)).index, Some(MAX_MATCHES_CONDITIONS));
    // Backtracking-prone in other engines, linear here.
    let rules =
        rules(json!([{"id": "a", "effect": "deny", "when": [{"path": "/s", "op": "matches", "value": "(a+)+$"}]}]));
    let arguments = json!({"s": format!("{}!", "a".repeat(30_000))});
    assert!(!rules[0].matches(&call("t", &arguments)));
}

#[test]
fn conditions_read_the_exact_arguments() {
    let arguments = json!({"count": 3, "branch": "feature/x", "env": "prod", "tags": ["a"], "a/b": {"~c": 1.0}});
    let holds = |op: &str, path: &str, value: Value| {
        let rule = rules(json!([{"id": "r", "effect": "allow", "when": [{"path": path, "op": op, "value": value}]}]));
        rule[0].matches(&call("t", &arguments))
    };
    assert!(holds("<=", "/count", json!(3)) && !holds("<", "/count", json!(3)) && holds(">", "/count", json!(2.5)));
    assert!(holds(">=", "/count", json!(3.0)) && !holds(">=", "/branch", json!(0)), "numbers only");
    assert!(holds("==", "/count", json!(3.0)) && holds("!=", "/env", json!("staging")));
    assert!(holds("==", "/a~1b/~0c", json!(1)), "RFC 6901 escapes");
    assert!(holds("in", "/env", json!(["prod", "dev"])) && holds("not_in", "/env", json!(["dev"])));
    assert!(holds("prefix", "/branch", json!("feature/")) && !holds("prefix", "/count", json!("3")));
    assert!(holds("matches", "/branch", json!("feature/.*")) && !holds("matches", "/branch", json!("feature")));
    assert!(holds("==", "/tags", json!(["a"])));
    // A path that does not exist: only exists false, != and not_in hold.
    assert!(holds("exists", "/missing", json!(false)) && !holds("exists", "/missing", json!(true)));
    assert!(holds("!=", "/missing", json!(1)) && holds("not_in", "/missing", json!([1])));
    for op in ["==", "<", "<=", ">", ">=", "prefix", "matches"] {
        let value = if op == "prefix" || op == "matches" { json!("x") } else { json!(1) };
        assert!(!holds(op, "/missing", value), "{op}");
    }
    assert!(!holds("in", "/missing", json!([null])));
}

#[test]
fn deny_wins_over_ask_and_ask_over_allow_then_the_tool_decides() {
    let arguments = json!({"count": 2});
    let policy = policy(json!([
        {"id": "allow-all", "tool": "*", "effect": "allow"},
        {"id": "ask-deletes", "tool": "delete_*", "effect": "ask"},
        {"id": "deny-big", "tool": "delete_*", "effect": "deny", "reason": "too many", "when": [{"path": "/count", "op": ">", "value": 1}]},
        {"id": "watch", "tool": "read_*", "effect": "deny", "mode": "log_only"},
    ]));
    let named = |rule: &str, effect| PolicyMatch { rule: rule.into(), effect, mode: RuleMode::Enforce, version: 4 };
    assert_eq!(
        policy.evaluate(&call("delete_branch", &arguments)),
        Verdict::Denied { policy: named("deny-big", Effect::Deny), reason: Some("too many".into()) }
    );
    let one = json!({"count": 1});
    assert_eq!(
        policy.evaluate(&call("delete_branch", &one)),
        Verdict::Ask { policy: Some(named("ask-deletes", Effect::Ask)) }
    );
    assert_eq!(
        policy.evaluate(&call("create_branch", &one)),
        Verdict::Allowed { policy: named("allow-all", Effect::Allow) }
    );
    // Allowed where no one would have been asked: no approval.
    let ungated = GatedCall { requires_approval: false, ..call("create_branch", &one) };
    assert_eq!(policy.evaluate(&ungated), Verdict::Run { logged: None });
    // A tool that always asks is never allowed by a rule.
    let always = GatedCall { always_ask: true, ..call("create_branch", &one) };
    assert_eq!(policy.evaluate(&always), Verdict::Ask { policy: Some(named("allow-all", Effect::Ask)) });
    // No enforce rule: the tool decides; a log_only rule is named.
    let logged = policy_of(json!([{"id": "watch", "effect": "deny", "mode": "log_only"}]));
    let watched = PolicyMatch { rule: "watch".into(), effect: Effect::Deny, mode: RuleMode::LogOnly, version: 4 };
    assert_eq!(logged.evaluate(&call("read_file", &one)), Verdict::Ask { policy: Some(watched.clone()) });
    // On a call that needs no approval it is named too: a deny is tried
    // on free calls before it is trusted.
    let free = GatedCall { requires_approval: false, ..call("read_file", &one) };
    assert_eq!(logged.evaluate(&free), Verdict::Run { logged: Some(watched) });
    assert_eq!(Policy::default().evaluate(&call("x", &one)), Verdict::Ask { policy: None });
    let other_agent = GatedCall { agent: "builder", ..call("delete_branch", &arguments) };
    let scoped = policy_of(json!([{"id": "j", "agent": "jan*", "effect": "deny"}]));
    assert_eq!(scoped.evaluate(&other_agent), Verdict::Ask { policy: None });
}

fn policy_of(rules_json: Value) -> Policy {
    policy(rules_json)
}

#[test]
fn a_replay_counts_what_rules_would_have_done_and_lists_disagreements() {
    let decided = |n: u128, tool: &str, count: i64, human| DecidedCall {
        run_id: crate::ids::RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
        approval_id: crate::ids::ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, n)),
        agent: "janitor".into(),
        tool: tool.into(),
        arguments: json!({ "count": count }),
        human,
        resolved_at: Timestamp::from_millis(1_795_303_478_123),
    };
    let history = [
        decided(1, "delete_branch", 2, HumanDecision::Approved),
        decided(2, "delete_branch", 3, HumanDecision::Rejected),
        decided(3, "delete_branch", 9, HumanDecision::Edited),
        decided(4, "deploy", 1, HumanDecision::Approved),
        decided(5, "read_file", 1, HumanDecision::Rejected),
    ];
    let replay = replay(
        rules(json!([
            {"id": "small-deletes", "tool": "delete_*", "effect": "allow", "when": [{"path": "/count", "op": "<=", "value": 3}]},
            {"id": "big-deletes", "tool": "delete_*", "effect": "deny", "when": [{"path": "/count", "op": ">", "value": 3}]},
            {"id": "reads", "tool": "read_*", "effect": "allow", "mode": "log_only"},
            {"id": "ask-deploys", "tool": "deploy", "effect": "ask"},
        ])),
        &history,
        || true,
    )
    .unwrap();
    assert_eq!((replay.evaluated, replay.would_allow, replay.would_deny, replay.would_ask), (5, 2, 1, 2));
    let disagreeing: Vec<(u128, &str)> =
        replay.disagreements.iter().map(|(call, policy)| (call.run_id.ulid().random(), policy.rule.as_str())).collect();
    // The log_only rule decides nothing, so agrees and disagrees with no one.
    assert_eq!(disagreeing, [(2, "small-deletes"), (3, "big-deletes")]);
    let tally = |rule: &str| replay.rules[rule];
    assert_eq!(tally("small-deletes"), RuleTally { matched: 2, agreed: 1, disagreed: 1 });
    assert_eq!(tally("big-deletes"), RuleTally { matched: 1, agreed: 0, disagreed: 1 });
    assert_eq!(tally("reads"), RuleTally { matched: 1, agreed: 0, disagreed: 0 });
    assert_eq!(tally("ask-deploys"), RuleTally { matched: 1, agreed: 0, disagreed: 0 });
}

#[test]
fn a_replay_stops_when_told_to() {
    let decided = DecidedCall {
        run_id: crate::ids::RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1)),
        approval_id: crate::ids::ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1)),
        agent: "janitor".into(),
        tool: "deploy".into(),
        arguments: json!({}),
        human: HumanDecision::Approved,
        resolved_at: Timestamp::from_millis(1_795_303_478_123),
    };
    let history = vec![decided; 10];
    let mut asked = 0;
    let stopped = replay(rules(json!([{"id": "any", "effect": "allow"}])), &history, || {
        asked += 1;
        asked <= 3
    });
    assert_eq!(stopped, Err(ReplayStopped { evaluated: 3 }));
}

/// Numbers compare exactly: a deny by value is not slipped past by a
/// number a double would round onto another.
#[test]
fn numbers_compare_exactly_and_inexact_rule_values_are_refused() {
    let policy = |when: Value| Policy {
        version: 1,
        rules: rules(json!([{"id": "no", "tool": "pay", "effect": "deny", "when": [when]}])),
        ..Policy::default()
    };
    let denied = |policy: &Policy, arguments: Value| {
        let call =
            GatedCall { agent: "a", tool: "pay", arguments: &arguments, requires_approval: false, always_ask: false };
        matches!(policy.evaluate(&call), Verdict::Denied { .. })
    };
    let not_listed = policy(json!({"path": "/to", "op": "not_in", "value": [12345678901234567890u64]}));
    assert!(denied(&not_listed, json!({"to": 12345678901234567891u64})));
    assert!(!denied(&not_listed, json!({"to": 12345678901234567890u64})));
    let large = policy(json!({"path": "/cents", "op": ">", "value": 9007199254740992u64}));
    assert!(denied(&large, json!({"cents": 9007199254740993u64})));
    assert!(!denied(&large, json!({"cents": 9007199254740992u64})));
    assert!(denied(&large, json!({"cents": 1e300})));
    assert!(!denied(&large, json!({"cents": 9007199254740991.5})));
    let fraction = policy(json!({"path": "/x", "op": "<=", "value": 2.5}));
    assert!(denied(&fraction, json!({"x": 2})) && !denied(&fraction, json!({"x": 3})));
    assert!(denied(&fraction, json!({"x": -9223372036854775808i64})));
    let same = policy(json!({"path": "/x", "op": "==", "value": {"n": [1]}}));
    assert!(denied(&same, json!({"x": {"n": [1.0]}})));
    let negative = policy(json!({"path": "/x", "op": "==", "value": 0}));
    assert!(denied(&negative, json!({"x": -0.0})));
    // Rule values that do not read as written are refused.
    for value in ["1e20", "100000000000000000000", "9007199254740993.0", "9007199254740992.0", "[1, 1e30]"] {
        let rule = format!(
            r#"{{"rules": [{{"id": "r", "effect": "deny", "when": [{{"path": "/x", "op": "==", "value": {value}}}]}}]}}"#
        );
        let error = parse_rules(&serde_json::from_str(&rule).unwrap()).unwrap_err();
        assert_eq!(error.param, "rules[0].when[0].value", "{value}");
        assert!(error.message.contains("beyond 2^53"), "{value}: {}", error.message);
    }
    for value in ["18446744073709551615", "-9223372036854775808", "9007199254740991.0", "1e15", "0.1"] {
        let rule = format!(
            r#"{{"rules": [{{"id": "r", "effect": "deny", "when": [{{"path": "/x", "op": "<", "value": {value}}}]}}]}}"#
        );
        assert!(parse_rules(&serde_json::from_str(&rule).unwrap()).is_ok(), "{value}");
    }
}
