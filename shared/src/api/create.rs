//! `POST /v1/agent/runs`: validate, store the run, queue it, answer `201`.

use crate::error_chain;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::body::{json_object, optional_string, reject_unknown_fields};
use super::{Api, ApiError, ApiResponse, run_response};
use crate::domain::{IdempotencyKey, Metadata, Owner, Run, RunId, RunInput};
use crate::queue::RunMessage;
use crate::store::{IdempotencyClaim, InsertOutcome, StoreError};

const FIELDS: &[&str] = &["input", "agent", "metadata"];
const IDEMPOTENCY_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);
const ACTIVE_RUNS_RETRY_AFTER_SECS: u64 = 5;

/// A create request, parsed.
struct NewRun {
    input: RunInput,
    agent: String,
    metadata: Metadata,
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

async fn parse_body(api: &Api, mut object: Map<String, Value>) -> Result<NewRun, ApiError> {
    reject_unknown_fields(&object, FIELDS)?;
    let input = match object.remove("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required.")),
        Some(Value::String(text)) => RunInput::parse(text).map_err(|error| ApiError::invalid("input", error.0))?,
        Some(_) => return Err(ApiError::invalid("input", "`input` must be a string.")),
    };
    let agent = optional_string(&mut object, "agent")?.unwrap_or_else(|| api.agents.default_name().to_owned());
    let metadata = parse_metadata(object.remove("metadata"))?;
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
    Ok(NewRun { input, agent, metadata })
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
    let canonical = serde_json::json!({
        "agent": new_run.agent,
        "input": new_run.input.as_str(),
        "metadata": new_run.metadata.as_map(),
    });
    sha256_hex(canonical.to_string().as_bytes())
}

fn created(run: &Run, replayed: bool) -> ApiResponse {
    let mut response = run_response(StatusCode::CREATED, run);
    let location = format!("/v1/agent/runs/{}", run.id);
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_str(&location).expect("run ids are ASCII"));
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    response
}

/// A created run is sent to the queue; when the send fails the create is
/// undone, unless the run has moved on meanwhile (a worker claimed it, so
/// the send was delivered after all, or a replay answered `201` with it):
/// then it stays, and this request answers `201` too.
async fn enqueue_created(api: &Api, run: &Run, key_hash: Option<&str>) -> Result<ApiResponse, ApiError> {
    let message = RunMessage { run_id: run.id, owner: run.owner.clone() };
    let Err(queue_error) = api.queue.enqueue(&message).await else {
        return Ok(created(run, false));
    };
    match api.runs.undo_create(run, key_hash).await {
        Ok(true) => Err(queue_error.into()),
        Ok(false) => {
            tracing::info!(run_id = %run.id, "enqueue failed but the run had moved on; it is kept");
            Ok(created(run, false))
        }
        Err(store_error) => {
            // The undo may or may not have happened: a run that is still
            // there is kept (the sweeper enqueues it), so it is answered 201.
            tracing::error!(run_id = %run.id, error = %error_chain(&store_error), "could not undo a create whose enqueue failed");
            match api.runs.get(&run.owner, run.id).await {
                Ok(Some(kept)) => Ok(created(&kept, false)),
                Ok(None) | Err(_) => Err(queue_error.into()),
            }
        }
    }
}

/// Answers a repeated `Idempotency-Key` with the run it created, or `None`
/// when that create was undone meanwhile (the key is free again).
async fn replay(api: &Api, owner: &Owner, run_id: RunId) -> Result<Option<ApiResponse>, ApiError> {
    loop {
        let Some(mut run) = api.runs.get(owner, run_id).await? else {
            return Ok(None);
        };
        if !run.is_as_created() {
            return Ok(Some(created(&run, true)));
        }
        // The first request may still be waiting on its send, and would undo
        // the create should the send fail. Pin the run with a write (which
        // that undo's condition refuses) before answering 201, and send it
        // ourselves: a duplicate message is harmless, a missing one is not.
        match api.runs.update(&mut run).await {
            Ok(()) => {}
            Err(StoreError::Conflict) => continue,
            Err(error) => return Err(error.into()),
        }
        api.queue.enqueue(&RunMessage { run_id, owner: owner.clone() }).await?;
        return Ok(Some(created(&run, true)));
    }
}

pub(super) async fn handle(api: &Api, owner: &Owner, request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    let object = json_object(request.headers(), request.body(), false)?;
    let new_run = parse_body(api, object).await?;
    let key = idempotency_key(request)?;
    let request_hash = request_hash(&new_run);
    let NewRun { input, agent, metadata } = new_run;
    let (input, metadata) = (input.into_string(), metadata.into_map());

    // A replay can find its run undone a moment after it found the key
    // taken; the key is free again then, so the create starts over.
    for _ in 0..3 {
        let now = api.clock.now();
        let run_id = RunId::from_ulid(api.ids.ulid_at(now));
        let claim = key.as_ref().map(|key| IdempotencyClaim {
            key_hash: sha256_hex(key.as_str().as_bytes()),
            request_hash: request_hash.clone(),
            created_at: now,
            expires_at: now.plus(IDEMPOTENCY_WINDOW),
        });
        let run = Run::new(run_id, owner.clone(), agent.clone(), input.clone(), metadata.clone(), &api.policy);
        match api.runs.insert(&run, claim.as_ref(), api.limits.max_active_runs).await? {
            InsertOutcome::Inserted => {
                return enqueue_created(api, &run, claim.as_ref().map(|claim| claim.key_hash.as_str())).await;
            }
            InsertOutcome::IdempotencyKeyTaken(record) => {
                if record.request_hash != request_hash {
                    return Err(ApiError::Conflict(
                        "This Idempotency-Key was already used with a different request. Use a new key for a new run."
                            .into(),
                    ));
                }
                if let Some(response) = replay(api, owner, record.run_id).await? {
                    return Ok(response);
                }
            }
            InsertOutcome::TooManyActiveRuns => {
                return Err(ApiError::RateLimited {
                    message: format!(
                        "This owner already has {} runs that are queued, running or awaiting approval. Wait for some to finish.",
                        api.limits.max_active_runs
                    ),
                    retry_after_secs: ACTIVE_RUNS_RETRY_AFTER_SECS,
                });
            }
        }
    }
    Err(ApiError::Unavailable("an idempotency key kept being taken and released".into()))
}
