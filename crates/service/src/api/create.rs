//! `POST /v1/agent/runs`: validate, store the run, queue it, answer `201`.

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::body::{json_object, optional_string, reject_unknown_fields, whole_number};
use super::{Api, ApiError, ApiResponse, RequestTrace, run_id_of, run_response};
use crate::auth::Principal;
use crate::lifecycle::{self, IdempotencyRequest, StartError, Started};
use agent_runs_domain::{Budget, IdempotencyKey, Metadata, Owner, Run, RunId, RunInput, RunTrace};
use agent_runs_platform::telemetry;
use agent_runs_ports::views::Shown;

const FIELDS: &[&str] = &["input", "agent", "metadata", "budget", "previous_run_id"];
const ACTIVE_RUNS_RETRY_AFTER_SECS: u64 = 5;

/// A create request, parsed.
struct NewRun {
    input: RunInput,
    agent: String,
    metadata: Metadata,
    budget: Budget,
    /// The ended run this one continues, with the state it ended with.
    previous: Option<Run>,
}

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

async fn parse_body(api: &Api, owner: &Owner, mut object: Map<String, Value>) -> Result<NewRun, ApiError> {
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
    let previous = match previous_run_id {
        Some(run_id) => Some(previous_run(api, owner, run_id, agent.as_deref()).await?),
        None => None,
    };
    let agent = match (agent, &previous) {
        (Some(agent), _) => agent,
        (None, Some(previous)) => previous.agent.clone(),
        (None, None) => api.agents.default_name().to_owned(),
    };
    // Last, as it may read the store: the agent and what it thinks of the input.
    let verdict = api.agents.check(&agent, input.as_str()).await?.ok_or_else(|| {
        let shown: String = agent.chars().take(64).collect();
        ApiError::invalid(
            "agent",
            format!(
                "Unknown agent `{shown}`. Available agents: {}, and those defined with `agent-runs agents put`.",
                api.agents.names()
            ),
        )
    })?;
    verdict
        .map_err(|message| ApiError::invalid("input", format!("The `{agent}` agent rejected the input: {message}")))?;
    // Read only when asked: the agent's own limits apply at execution anyway.
    let allowed = if budget == Budget::default() { Budget::default() } else { api.agents.budget(&agent).await? };
    for (field, asked, most) in [
        ("max_total_tokens", budget.max_total_tokens, allowed.max_total_tokens),
        ("max_tool_calls", budget.max_tool_calls, allowed.max_tool_calls),
    ] {
        if let (Some(asked), Some(most)) = (asked, most)
            && asked > most
        {
            return Err(ApiError::invalid_param(
                format!("budget.{field}"),
                format!("`budget.{field}` may be at most {most}, the `{agent}` agent's own limit."),
            ));
        }
    }
    Ok(NewRun { input, agent, metadata, budget, previous })
}

/// The run a create continues, checked in the contract's order: the
/// owner's (`404`), of the agent named if one is (`400`), ended (`409`).
async fn previous_run(api: &Api, owner: &Owner, run_id: RunId, agent: Option<&str>) -> Result<Run, ApiError> {
    let previous = api
        .runs
        .get_to_continue(owner, run_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("`previous_run_id` names no run that exists for this API key.".into()))?;
    if let Some(agent) = agent
        && agent != previous.agent
    {
        let shown: String = agent.chars().take(64).collect();
        return Err(ApiError::invalid(
            "agent",
            format!(
                "The run {run_id} was run by the `{}` agent, not `{shown}`: a continuation uses the same agent (leave `agent` out).",
                previous.agent
            ),
        ));
    }
    if !previous.status.is_terminal() {
        return Err(ApiError::Conflict(format!(
            "The run {run_id} is {}: only a run that ended (succeeded, failed or canceled) can be continued.",
            previous.status.as_str()
        )));
    }
    Ok(previous)
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

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A fingerprint of what the request asks for, insensitive to formatting.
fn request_hash(new_run: &NewRun) -> String {
    let mut canonical = serde_json::json!({
        "agent": new_run.agent,
        "input": new_run.input.as_str(),
        "metadata": new_run.metadata.as_map(),
    });
    // Only when set, so requests without one keep the fingerprints they had.
    if new_run.budget != Budget::default() {
        canonical["budget"] = serde_json::json!([new_run.budget.max_total_tokens, new_run.budget.max_tool_calls]);
    }
    if let Some(previous) = &new_run.previous {
        canonical["previous_run_id"] = previous.id.to_string().into();
    }
    sha256_hex(canonical.to_string().as_bytes())
}

fn created(run: &Run, replayed: bool, shown: Shown) -> ApiResponse {
    let mut response = run_response(StatusCode::CREATED, run, shown);
    let location = format!("/v1/agent/runs/{}", run.id);
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_str(&location).expect("run ids are ASCII"));
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

pub(super) async fn handle(api: &Api, by: &Principal, request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    let object = json_object(request.headers(), request.body(), false)?;
    let new_run = parse_body(api, &by.owner, object).await?;
    let key = idempotency_key(request)?;
    let idempotency = key.map(|key| IdempotencyRequest {
        key_hash: sha256_hex(key.as_str().as_bytes()),
        request_hash: request_hash(&new_run),
    });
    let NewRun { input, agent, metadata, budget, previous } = new_run;
    let started = api
        .lifecycle
        .start(lifecycle::NewRun {
            owner: by.owner.clone(),
            created_by: by.key_id,
            agent,
            input: input.into_string(),
            metadata: metadata.into_map(),
            budget,
            continues: previous,
            idempotency,
            trace: RunTrace::under(
                request
                    .extensions()
                    .get::<RequestTrace>()
                    .map_or_else(|| telemetry::request_span_ids(None).0, |trace| trace.0),
            ),
        })
        .await;
    if let Ok(Started::Created(run) | Started::Replayed(run)) = &started {
        tracing::Span::current().record("run_id", tracing::field::display(run.id));
    }
    match started {
        Ok(Started::Created(run)) => Ok(created(&run, false, api.shown)),
        Ok(Started::Replayed(run)) => Ok(created(&run, true, api.shown)),
        Err(StartError::KeyReused) => Err(ApiError::Conflict(
            "This Idempotency-Key was already used with a different request. Use a new key for a new run.".into(),
        )),
        Err(StartError::TooManyActiveRuns { max }) => Err(ApiError::RateLimited {
            message: format!(
                "This owner already has {max} runs that are queued, running or awaiting approval. Wait for some to finish."
            ),
            retry_after_secs: ACTIVE_RUNS_RETRY_AFTER_SECS,
        }),
        Err(StartError::NotQueued(error)) => Err(error.into()),
        Err(error @ StartError::KeyChurn) => Err(ApiError::Unavailable(Box::new(error))),
        Err(StartError::Store(error)) => Err(error.into()),
    }
}
