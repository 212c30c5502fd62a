//! `POST /v1/agent/runs`: validate, store the run, queue it, answer `201`.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use serde_json::{Map, Value, json};

use super::body::{json_object, optional_string, reject_unknown_fields, whole_number};
use super::openapi::{Parts, error_response, header, operation};
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, RequestTrace, run_id_of, run_response};
use crate::auth::Principal;
use crate::commands::{ContinueRefused, NewRun, RunCommands, StartError, Started};
use agent_runs_domain::{Budget, IdempotencyKey, MAX_IDEMPOTENCY_KEY_CHARS, Metadata, Run, RunInput, RunTrace, Scope};
use agent_runs_platform::telemetry;
use agent_runs_ports::views::ExtraFields;

const FIELDS: &[&str] = &["input", "agent", "metadata", "budget", "previous_run_id"];
const ACTIVE_RUNS_RETRY_AFTER_SECS: u64 = 5;

/// The largest budget limit: exact in every JSON reader (2^53 - 1).
pub const MAX_BUDGET: u64 = (1 << 53) - 1;

/// `budget`: an object of optional whole-number limits.
fn parse_budget(value: Option<Value>) -> Result<Budget, ApiError> {
    let mut object = match value {
        None | Some(Value::Null) => return Ok(Budget::default()),
        Some(Value::Object(object)) => object,
        Some(_) => return Err(ApiError::invalid("budget", "`budget` must be an object.")),
    };
    reject_unknown_fields(&object, &["max_total_tokens", "max_tool_calls"])?;
    let mut limit = |field: &'static str, least: u64| match object.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            whole_number(&value).filter(|limit| (least..=MAX_BUDGET).contains(limit)).map(Some).ok_or_else(|| {
                ApiError::invalid_param(
                    format!("budget.{field}"),
                    format!("`budget.{field}` must be a whole number from {least} to {MAX_BUDGET}."),
                )
            })
        }
    };
    Ok(Budget { max_total_tokens: limit("max_total_tokens", 1)?, max_tool_calls: limit("max_tool_calls", 0)? })
}

fn parse_metadata(value: Option<Value>) -> Result<Metadata, ApiError> {
    let object = match value {
        None | Some(Value::Null) => return Ok(Metadata::default()),
        Some(Value::Object(object)) => object,
        Some(_) => {
            return Err(ApiError::invalid("metadata", "`metadata` must be an object of strings."));
        }
    };
    let entries = object
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(text) => Ok((key, text)),
            _ => Err(ApiError::invalid("metadata", format!("The value of `metadata.{key}` must be a string."))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Metadata::parse(entries).map_err(|error| ApiError::invalid("metadata", error.0))
}

/// The body's fields, checked each on its own; what they mean together
/// (the agent, its budget, the run continued) is the command's to judge.
fn parse_body(mut object: Map<String, Value>, trace: RunTrace) -> Result<NewRun, ApiError> {
    reject_unknown_fields(&object, FIELDS)?;
    let input = match object.remove("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required.")),
        Some(Value::String(text)) => RunInput::parse(text).map_err(|error| ApiError::invalid("input", error.0))?,
        Some(_) => return Err(ApiError::invalid("input", "`input` must be a string.")),
    };
    let agent = optional_string(&mut object, "agent")?;
    let metadata = parse_metadata(object.remove("metadata"))?;
    let budget = parse_budget(object.remove("budget"))?;
    let previous_run_id =
        optional_string(&mut object, "previous_run_id")?.map(|text| run_id_of("previous_run_id", &text)).transpose()?;
    Ok(NewRun { input, agent, metadata, budget, previous_run_id, trace })
}

fn idempotency_key(request: &Request<Bytes>) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = request.headers().get_all("idempotency-key").iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::invalid("Idempotency-Key", "Send at most one Idempotency-Key header."));
    }
    IdempotencyKey::parse(value.as_bytes()).map(Some).map_err(|error| ApiError::invalid("Idempotency-Key", error.0))
}

fn created(run: &Run, replayed: bool, shown: ExtraFields) -> ApiResponse {
    let mut response = run_response(StatusCode::CREATED, run, shown);
    let location = format!("/v1/agent/runs/{}", run.id);
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_str(&location).expect("run ids are ASCII"));
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

pub(super) async fn handle(
    commands: &RunCommands,
    shown: ExtraFields,
    by: &Principal,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let object = json_object(request.headers(), request.body(), false)?;
    let trace = RunTrace::under(
        request.extensions().get::<RequestTrace>().map_or_else(|| telemetry::request_span_ids(None).0, |trace| trace.0),
    );
    let new_run = parse_body(object, trace)?;
    // In the contract's order: the body's fields, what they mean together,
    // then the Idempotency-Key header.
    let accepted = commands.accept(by, new_run).await.map_err(refused)?;
    let started = commands.start(accepted, idempotency_key(request)?).await;
    if let Ok(Started::Created(run) | Started::Replayed(run)) = &started {
        tracing::Span::current().record("run_id", tracing::field::display(run.id));
    }
    match started {
        Ok(Started::Created(run)) => Ok(created(&run, false, shown)),
        Ok(Started::Replayed(run)) => Ok(created(&run, true, shown)),
        Err(error) => Err(refused(error)),
    }
}

fn refused(error: StartError) -> ApiError {
    let shown = |agent: &str| agent.chars().take(64).collect::<String>();
    match error {
        StartError::Previous { why: ContinueRefused::NotFound, .. } => {
            ApiError::NotFound("`previous_run_id` names no run that exists for this API key.".into())
        }
        StartError::Previous { run_id, why: ContinueRefused::OtherAgent { asked, ran } } => ApiError::invalid(
            "agent",
            format!(
                "The run {run_id} was run by the `{ran}` agent, not `{}`: a continuation uses the same agent (leave `agent` out).",
                shown(&asked)
            ),
        ),
        StartError::Previous { run_id, why: ContinueRefused::NotEnded(status) } => ApiError::Conflict(format!(
            "The run {run_id} is {}: only a run that ended (succeeded, failed or canceled) can be continued.",
            status.as_str()
        )),
        StartError::UnknownAgent { agent, available } => ApiError::invalid(
            "agent",
            format!(
                "Unknown agent `{}`. Available agents: {available}, and those defined with `agent-runs agents put`.",
                shown(&agent)
            ),
        ),
        StartError::InputRejected { agent, reason } => {
            ApiError::invalid("input", format!("The `{agent}` agent rejected the input: {reason}"))
        }
        StartError::OverAgentBudget { field, most, agent } => ApiError::invalid_param(
            format!("budget.{field}"),
            format!("`budget.{field}` may be at most {most}, the `{agent}` agent's own limit."),
        ),
        StartError::KeyReused => ApiError::Conflict(
            "This Idempotency-Key was already used with a different request. Use a new key for a new run.".into(),
        ),
        StartError::TooManyActiveRuns { max } => ApiError::RateLimited {
            message: format!(
                "This owner already has {max} runs that are queued, running or awaiting approval. Wait for some to finish."
            ),
            retry_after_secs: ACTIVE_RUNS_RETRY_AFTER_SECS,
        },
        StartError::NotQueued(error) => error.into(),
        error @ StartError::KeyChurn => ApiError::Unavailable(Box::new(error)),
        StartError::Store(error) => error.into(),
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Create,
    method: Method::POST,
    path: "/v1/agent/runs",
    operation_id: "createRun",
    function: "create",
    handler: Handler::Keyed {
        scope: Scope::RunsWrite,
        handle: |api, call| Box::pin(handle(&api.commands, api.shown, call.by, call.request)),
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { links, .. } = parts;
    operation(
        route.operation_id,
        "Create a run",
        json!([{
            "name": "Idempotency-Key",
            "in": "header",
            "required": false,
            "description": "The same owner sending the same key within 24 hours gets the original run back; with a different body, 409.",
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS, "pattern": "^[\\x20-\\x7E]+$"}
        }, {
            "name": "traceparent",
            "in": "header",
            "required": false,
            "description": "W3C Trace Context: the run joins the caller's trace (its `trace_id` is the caller's) and the create request's span is a child of the caller's span; a caller's unsampled trace is not recorded. Ignored when malformed.",
            "schema": {"type": "string", "examples": ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]}
        }]),
        Some(
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateRun"}}}}),
        ),
        json!({
            "201": {
                "description": "The run, queued (or the original run of a replayed Idempotency-Key).",
                "headers": {
                    "x-request-id": {"$ref": "#/components/headers/RequestId"},
                    "Location": header("/v1/agent/runs/{id}", json!({"type": "string"})),
                    "Idempotent-Replayed": header("`true` when this answers a replayed Idempotency-Key.", json!({"type": "string", "enum": ["true"]}))
                },
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
                "links": links
            },
            "404": error_response("`previous_run_id` names no run of this API key's owner.", &[]),
            "409": error_response("The Idempotency-Key was used with a different request, or the run `previous_run_id` names has not ended.", &[])
        }),
    )
}
