//! `/v1/policies`: the owner's approval policy, replaced whole, and
//! candidate rules tried on the calls people decided.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use serde_json::{Value, json};

use super::body::{json_object, reject_unknown_fields, whole_number};
use super::openapi::{Parts, error_response, operation};
use super::query::no_query;
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse};
use crate::auth::Principal;
use agent_runs_domain::{Owner, Policy, ReplayStopped, RuleError, Scope, parse_rules, replay};
use agent_runs_ports::store::PolicyStore;

/// Calls a test replays when it names no `limit`, and the most it may.
const DEFAULT_TEST_LIMIT: u64 = 1_000;
const MAX_TEST_LIMIT: u64 = 10_000;
/// The longest a test may take, from its request on (its read of the
/// history included): past it, it stops and says so, well within a Lambda
/// function's 10 s.
const MAX_TEST_WORK: Duration = Duration::from_secs(5);

/// Owners with a test at work in this process: one at a time each, so a
/// client cannot fill the cores with tests. Per process only: two Lambda
/// instances, or two servers, may each run one (a Lambda instance serves
/// one request at a time anyway).
static TESTING: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// An owner's test at work, until the replay ends (the guard goes with
/// it onto the blocking thread) or the test fails before it.
struct TestAtWork(String);

impl TestAtWork {
    fn start(owner: &Owner) -> Result<TestAtWork, ApiError> {
        let owner = owner.to_string();
        if !TESTING.lock().unwrap_or_else(PoisonError::into_inner).insert(owner.clone()) {
            return Err(ApiError::RateLimited {
                message: "Another policy test of this owner is still at work: wait for its answer, then test again."
                    .into(),
                retry_after_secs: 1,
            });
        }
        Ok(TestAtWork(owner))
    }
}

impl Drop for TestAtWork {
    fn drop(&mut self) {
        TESTING.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.0);
    }
}

fn rule_error(error: RuleError) -> ApiError {
    let message = format!("`{}` {}.", error.param, error.message);
    match error.index {
        Some(index) => ApiError::InvalidRule { index, param: error.param, message },
        None => ApiError::invalid_param(error.param, message),
    }
}

fn policy_response(status: StatusCode, policy: &Policy) -> ApiResponse {
    let mut response = json_response(status, &policy.to_json());
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", policy.version)) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

/// `If-Match: "<version>"`: the version the put must replace (the quotes
/// of an entity tag may be left out).
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let mut values = headers.get_all(header::IF_MATCH).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let version = value
        .to_str()
        .ok()
        .filter(|_| values.next().is_none())
        .map(|text| text.trim())
        .map(|text| text.strip_prefix('"').and_then(|text| text.strip_suffix('"')).unwrap_or(text))
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()))
        .and_then(|digits| digits.parse::<u64>().ok());
    version.map(Some).ok_or_else(|| {
        ApiError::invalid(
            "If-Match",
            "`If-Match` must be the policy's version in quotes, as its ETag shows it (for example \"3\").",
        )
    })
}

pub(super) async fn get(
    policies: &dyn PolicyStore,
    principal: &Principal,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    Ok(policy_response(StatusCode::OK, &policies.policy(&principal.owner).await?))
}

pub(super) async fn put(
    policies: &dyn PolicyStore,
    principal: &Principal,
    now: agent_runs_domain::Timestamp,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let expected = if_match(request.headers())?;
    let body = Value::Object(json_object(request.headers(), request.body(), false)?);
    let rules = parse_rules(&body).map_err(rule_error)?;
    let owner = &principal.owner;
    match policies.put_policy(owner, expected, &rules, now, principal.key_id).await? {
        Some(policy) => Ok(policy_response(StatusCode::OK, &policy)),
        None => {
            let current = policies.policy(owner).await?.version;
            Err(ApiError::PreconditionFailed(format!(
                "The policy is at version {current}, not {}: read it again, and send its ETag as `If-Match`.",
                expected.unwrap_or_default()
            )))
        }
    }
}

pub(super) async fn test(
    policies: &dyn PolicyStore,
    principal: &Principal,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["rules", "limit"])?;
    let limit = match body.remove("limit") {
        None => DEFAULT_TEST_LIMIT,
        Some(value) => whole_number(&value).filter(|limit| (1..=MAX_TEST_LIMIT).contains(limit)).ok_or_else(|| {
            ApiError::invalid("limit", format!("`limit` must be a whole number from 1 to {MAX_TEST_LIMIT}."))
        })?,
    };
    let rules = parse_rules(&Value::Object(body)).map_err(rule_error)?;
    let deadline = Instant::now() + MAX_TEST_WORK;
    let at_work = TestAtWork::start(&principal.owner)?;
    // A read that takes the whole budget is the store's fault, not the request's.
    let history = tokio::time::timeout_at(deadline.into(), policies.decided_calls(&principal.owner, limit as usize))
        .await
        .map_err(|_| ApiError::Unavailable("the history was not read within the test's budget".into()))??;
    let total = history.len();
    // Up to 10,000 calls times 200 rules: off the threads that answer
    // requests, and within MAX_TEST_WORK.
    let replay = tokio::task::spawn_blocking(move || {
        let _at_work = at_work;
        replay(rules, &history, || Instant::now() < deadline)
    })
    .await
    .map_err(|error| ApiError::Internal(Box::new(error)))?
    .map_err(|ReplayStopped { evaluated }| {
        ApiError::invalid(
            "limit",
            format!(
                "The test stopped after {} seconds, having replayed {evaluated} of {total} calls: test fewer calls (`limit`) or fewer `matches` conditions.",
                MAX_TEST_WORK.as_secs()
            ),
        )
    })?;
    let disagreements: Vec<Value> = replay
        .disagreements
        .iter()
        .map(|(call, policy)| {
            json!({
                "run_id": call.run_id.to_string(),
                "approval_id": call.approval_id.to_string(),
                "agent": call.agent,
                "tool": call.tool,
                "arguments": call.arguments,
                "human": call.human.as_str(),
                "rule": policy.rule,
                "effect": policy.effect.as_str(),
            })
        })
        .collect();
    let rules: serde_json::Map<String, Value> = replay
        .rules
        .iter()
        .map(|(id, tally)| {
            (id.clone(), json!({"matched": tally.matched, "agreed": tally.agreed, "disagreed": tally.disagreed}))
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "evaluated": replay.evaluated,
            "would_allow": replay.would_allow,
            "would_deny": replay.would_deny,
            "would_ask": replay.would_ask,
            "disagreements": disagreements,
            "rules": rules,
        }),
    ))
}

pub(super) const GET: Route = Route {
    operation: Operation::GetPolicy,
    method: Method::GET,
    path: "/v1/policies",
    operation_id: "getPolicy",
    function: "policies",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(get(api.policies.as_ref(), call.by, call.request)),
    },
    describe: Some(describe_get),
};

fn describe_get(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
        route.operation_id,
        "Get the owner's approval policy",
        json!([]),
        None,
        json!({"200": described_policy("The policy in force (version 0 and no rules until the first put).")}),
    )
}

pub(super) const PUT: Route = Route {
    operation: Operation::PutPolicy,
    method: Method::PUT,
    path: "/v1/policies",
    operation_id: "putPolicy",
    function: "policies",
    handler: Handler::Keyed {
        scope: Scope::PoliciesManage,
        handle: |api, call| Box::pin(put(api.policies.as_ref(), call.by, api.clock.now(), call.request)),
    },
    describe: Some(describe_put),
};

fn describe_put(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
        route.operation_id,
        "Replace the owner's approval policy",
        json!([{
            "name": "If-Match",
            "in": "header",
            "required": false,
            "description": "The version to replace, as the ETag shows it (`\"3\"`; the quotes may be left out); another put since answers 412.",
            "schema": {"type": "string", "pattern": "^(\"[0-9]+\"|[0-9]+)$"}
        }]),
        Some(
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyInput"}}}}),
        ),
        json!({
            "200": described_policy("The new policy, one version on."),
            "409": error_response("Other puts kept coming first; send it again.", &[]),
            "412": error_response("The policy is no longer at the version If-Match names.", &[])
        }),
    )
}

pub(super) const TEST: Route = Route {
    operation: Operation::TestPolicy,
    method: Method::POST,
    path: "/v1/policies/test",
    operation_id: "testPolicy",
    function: "policies",
    handler: Handler::Keyed {
        scope: Scope::PoliciesManage,
        handle: |api, call| Box::pin(test(api.policies.as_ref(), call.by, call.request)),
    },
    describe: Some(describe_test),
};

fn describe_test(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
        route.operation_id,
        "Try rules on the tool calls people decided",
        json!([]),
        Some(
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyTest"}}}}),
        ),
        json!({"200": {
            "description": "What the rules would have done with the most recent decisions; nothing is changed.",
            "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PolicyTestResult"}}}
        }}),
    )
}

fn described_policy(description: &str) -> Value {
    json!({
        "description": description,
        "headers": {
            "x-request-id": {"$ref": "#/components/headers/RequestId"},
            "ETag": super::openapi::header("The policy's version, in quotes: send it as If-Match.", json!({"type": "string"}))
        },
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Policy"}}}
    })
}
