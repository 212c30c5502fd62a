//! The OpenAPI 3.1 document of the contract, built from the same constants,
//! enums and agent registry that the operations use, so it cannot drift
//! from them. `docs/openapi.json` is this document for the built-in agents
//! (a test keeps the file equal to it), and `GET /v1/openapi.json` serves it
//! for the running deployment.

use serde_json::{Value, json};

use super::list::{DEFAULT_LIMIT, MAX_LIMIT};
use super::routes::{Operation, ROUTES};
use super::{ApiError, MAX_BODY_BYTES};
use super::{batch, create, events, inbox, webhooks};
use crate::domain::{
    ApprovalKind, ApprovalStatus, EVENT_TYPES, MAX_APPROVAL_ARGUMENTS_BYTES, MAX_COMMENT_CHARS,
    MAX_IDEMPOTENCY_KEY_CHARS, MAX_INPUT_BYTES, MAX_METADATA_KEY_CHARS, MAX_METADATA_KEYS, MAX_METADATA_VALUE_CHARS,
    MAX_WEBHOOK_DESCRIPTION_CHARS, MAX_WEBHOOK_URL_BYTES, MAX_WEBHOOKS_PER_OWNER, RETRY_DELAYS, RunStatus,
};

pub const PATH: &str = "/v1/openapi.json";

const ULID: &str = "[0-7][0-9A-HJKMNP-TV-Z]{25}";
const TIMESTAMP: &str = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$";

/// Every error code, with the status it comes with.
pub fn error_codes() -> Vec<(u16, &'static str)> {
    [
        ApiError::invalid(None, ""),
        ApiError::Unauthorized,
        ApiError::Forbidden(String::new()),
        ApiError::NotFound(String::new()),
        ApiError::MethodNotAllowed { allow: String::new() },
        ApiError::Conflict(String::new()),
        ApiError::RequestTimeout,
        ApiError::RequestTooLarge,
        ApiError::UnsupportedMediaType,
        ApiError::RateLimited { message: String::new(), retry_after_secs: 0 },
        ApiError::Internal("".into()),
        ApiError::Unavailable("".into()),
    ]
    .iter()
    .map(|error| (error.status().as_u16(), error.code()))
    .collect()
}

fn timestamp(nullable: bool) -> Value {
    let kind = if nullable { json!(["string", "null"]) } else { json!("string") };
    json!({"type": kind, "format": "date-time", "pattern": TIMESTAMP, "description": "RFC 3339, UTC, milliseconds."})
}

fn header(description: &str, schema: Value) -> Value {
    json!({"description": description, "schema": schema})
}

fn error_response(description: &str, extra_headers: &[(&str, Value)]) -> Value {
    let mut headers = json!({"x-request-id": {"$ref": "#/components/headers/RequestId"}});
    for (name, value) in extra_headers {
        headers[*name] = value.clone();
    }
    json!({
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn run_response(description: &str, status_headers: Value) -> Value {
    let mut headers = json!({"x-request-id": {"$ref": "#/components/headers/RequestId"}});
    for (name, value) in status_headers.as_object().into_iter().flatten() {
        headers[name] = value.clone();
    }
    json!({
        "description": description,
        "headers": headers,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}}
    })
}

/// The responses every operation can give besides its own.
fn common_errors(responses: &mut Value, with_body: bool) {
    let retry_after = json!({"$ref": "#/components/headers/RetryAfter"});
    responses["400"] = json!({"$ref": "#/components/responses/InvalidRequest"});
    responses["401"] = json!({"$ref": "#/components/responses/Unauthorized"});
    responses["403"] = error_response("The API key lacks the scope this operation needs (the message names it).", &[]);
    responses["429"] =
        error_response("Too many active runs, or too many requests.", &[("Retry-After", retry_after.clone())]);
    responses["500"] = error_response("A defect; retry later and quote the x-request-id.", &[]);
    responses["503"] = error_response("A dependency failed; safe to retry.", &[("Retry-After", retry_after)]);
    if with_body {
        responses["408"] =
            error_response("The body did not arrive in time (embedded server); the connection is closed.", &[]);
        responses["413"] = error_response(&format!("The body is larger than {} KiB.", MAX_BODY_BYTES / 1024), &[]);
        responses["415"] = error_response("The body is not sent as application/json.", &[]);
    }
}

fn operation(id: &str, summary: &str, parameters: Value, body: Option<Value>, mut responses: Value) -> Value {
    common_errors(&mut responses, body.is_some());
    let mut operation =
        json!({"operationId": id, "summary": summary, "parameters": parameters, "responses": responses});
    if let Some(body) = body {
        operation["requestBody"] = body;
    }
    operation
}

/// A decision's body; `extra` adds the required properties a batch
/// element has (a list, not an object, whose key order would depend on a
/// `serde_json` feature). One object, with "`arguments` exactly with edit"
/// as `if`/`then`/`else`: client generators (openapi-python-client,
/// openapi-typescript) ignore those and see one model, while a `oneOf` of
/// partial objects made openapi-python-client emit a model twice and
/// generate a client that fails at import. Validators still apply the rule.
fn decision_schema(extra: &[(&str, Value)]) -> Value {
    let mut schema = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["decision"],
        "properties": {
            "decision": {"type": "string", "enum": ["approve", "reject", "edit"], "description": "edit: approve with `arguments` in place of the proposed ones (tool_call approvals only; checked against the tool's JSON Schema)."},
            "comment": {"type": ["string", "null"], "maxLength": MAX_COMMENT_CHARS, "description": "A reject's comment reaches the model as the reason."},
            "arguments": {"type": ["object", "null"], "additionalProperties": true, "description": format!("With edit, and only with edit (required there): the arguments to call the tool with, at most {MAX_APPROVAL_ARGUMENTS_BYTES} bytes as JSON.")},
            "arguments_sha256": {"type": ["string", "null"], "pattern": "^[0-9a-fA-F]{64}$", "description": "The approval's arguments_sha256 as the person saw it; another value is 409 and nothing changes."}
        },
        "if": {"properties": {"decision": {"const": "edit"}}},
        "then": {"required": ["arguments"], "properties": {"arguments": {"type": "object"}}},
        "else": {"properties": {"arguments": {"type": "null"}}}
    });
    for (name, property) in extra {
        schema["properties"][*name] = property.clone();
        schema["required"].as_array_mut().expect("a list").push(json!(name));
    }
    schema
}

fn webhook_response(description: &str, with_secret: bool) -> Value {
    let schema = if with_secret { "WebhookWithSecret" } else { "Webhook" };
    json!({
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

fn webhook_schemas() -> serde_json::Map<String, Value> {
    let event_types: Vec<&str> = std::iter::once("*").chain(EVENT_TYPES).collect();
    let retries: Vec<String> = RETRY_DELAYS.iter().map(|delay| format!("{} s", delay.as_secs())).collect();
    let webhook = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "url", "events", "description", "status", "created_at"],
        "properties": {
            "id": {"type": "string", "pattern": format!("^wh_{ULID}$")},
            "url": {"type": "string", "format": "uri"},
            "events": {"type": "array", "items": {"type": "string", "enum": event_types}},
            "description": {"type": ["string", "null"]},
            "status": {"type": "string", "enum": ["enabled", "disabled"], "description": "disabled: by a 410 Gone answer, or after every attempt failed for 5 days."},
            "created_at": timestamp(false)
        }
    });
    let mut with_secret = webhook.clone();
    with_secret["properties"]["secret"] = json!({"type": "string", "pattern": "^whsec_[A-Za-z0-9+/]{43}=$", "description": "The signing secret: HMAC-SHA256 with its base64-decoded bytes, per the Standard Webhooks specification."});
    with_secret["required"].as_array_mut().expect("a list").push(json!("secret"));
    let list = |item: &str| {
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["data", "next_cursor"],
            "properties": {
                "data": {"type": "array", "items": {"$ref": format!("#/components/schemas/{item}")}},
                "next_cursor": {"type": ["string", "null"]}
            }
        })
    };
    let schemas = json!({
        "Webhook": webhook,
        "WebhookWithSecret": with_secret,
        "WebhookList": list("Webhook"),
        "CreateWebhook": {
            "type": "object",
            "additionalProperties": false,
            "required": ["url", "events"],
            "description": format!("At most {MAX_WEBHOOKS_PER_OWNER} endpoints per owner. Deliveries are POSTs signed per standardwebhooks.com (webhook-id: the event's id, webhook-timestamp, webhook-signature) with body {{\"type\", \"timestamp\", \"data\": <the event>}}; a 2xx is delivered, anything else is retried after {} (each ±20 %).", retries.join(", ")),
            "properties": {
                "url": {"type": "string", "maxLength": MAX_WEBHOOK_URL_BYTES, "description": "https, and not a loopback, private, link-local or metadata address (checked again on the resolved address at every delivery), unless the deployment allows private addresses."},
                "events": {"type": "array", "minItems": 1, "uniqueItems": true, "items": {"type": "string", "enum": event_types}, "description": "Event types, or [\"*\"] alone for all."},
                "description": {"type": ["string", "null"], "maxLength": MAX_WEBHOOK_DESCRIPTION_CHARS}
            }
        },
        "Deleted": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "deleted"],
            "properties": {"id": {"type": "string"}, "deleted": {"const": true}}
        },
        "DeliveryAttempt": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "event_id", "type", "attempt", "http_status", "error", "duration_ms", "at"],
            "properties": {
                "id": {"type": "string", "pattern": format!("^dlv_{ULID}$")},
                "event_id": {"type": "string", "pattern": format!("^evt_{ULID}$"), "description": "Also the delivery's webhook-id header."},
                "type": {"type": "string", "enum": EVENT_TYPES},
                "attempt": {"type": "integer", "minimum": 1},
                "http_status": {"type": ["integer", "null"], "description": "The endpoint's answer; null when there was none."},
                "error": {"type": ["string", "null"], "description": "Why the attempt failed; null when delivered."},
                "duration_ms": {"type": "integer", "minimum": 0},
                "at": timestamp(false)
            }
        },
        "DeliveryList": list("DeliveryAttempt")
    });
    match schemas {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

/// The document, with `agents` as the values `agent` may take.
pub fn document(agents: &[&str], default_agent: &str) -> Value {
    let statuses: Vec<&str> = RunStatus::ALL.iter().map(|status| status.as_str()).collect();
    let approval_statuses: Vec<&str> = ApprovalStatus::ALL.iter().map(|status| status.as_str()).collect();
    let codes: Vec<&str> = error_codes().into_iter().map(|(_, code)| code).collect();
    let run_id = json!({"name": "run_id", "in": "path", "required": true, "schema": {"type": "string", "pattern": format!("^run_{ULID}$")}});
    let approval_id = json!({"name": "approval_id", "in": "path", "required": true, "schema": {"type": "string", "pattern": format!("^apr_{ULID}$")}});
    let not_found = json!({"$ref": "#/components/responses/NotFound"});
    let webhook_id = json!({"name": "webhook_id", "in": "path", "required": true, "schema": {"type": "string", "pattern": format!("^wh_{ULID}$")}});
    let webhook_not_found = error_response("No such webhook endpoint for this API key's owner.", &[]);
    let page_parameters = json!([
        {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": webhooks::MAX_LIMIT}, {"const": ""}], "default": webhooks::DEFAULT_LIMIT}},
        {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page of the same list.", "schema": {"type": "string"}}
    ]);
    let conflict = error_response("The run or approval is not in a state that allows this.", &[]);
    let links = json!({
        "GetRun": {"operationId": "getRun", "parameters": {"run_id": "$response.body#/id"}},
        "CancelRun": {"operationId": "cancelRun", "parameters": {"run_id": "$response.body#/id"}},
        "ListRunEvents": {"operationId": "listRunEvents", "parameters": {"run_id": "$response.body#/id"}}
    });

    let usage = json!({
        "description": "Tokens the agent's model used so far: present only for runs of a defined agent whose provider reports them.",
        "type": "object",
        "additionalProperties": false,
        "required": ["input_tokens", "output_tokens", "total_tokens", "tool_calls"],
        "properties": {
            "input_tokens": {"type": "integer", "minimum": 0},
            "output_tokens": {"type": "integer", "minimum": 0},
            "total_tokens": {"type": "integer", "minimum": 0},
            "tool_calls": {"type": "integer", "minimum": 0, "description": "HTTP tool calls made."}
        }
    });
    let budget = |description: &str| {
        json!({
            "type": ["object", "null"],
            "additionalProperties": false,
            "description": description,
            "properties": {
                "max_total_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": create::MAX_BUDGET, "description": "Tokens (input and output) the run may use."},
                "max_tool_calls": {"type": ["integer", "null"], "minimum": 0, "maximum": create::MAX_BUDGET, "description": "Tool calls the run may make."}
            }
        })
    };
    let approval = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id", "kind", "action", "tool", "arguments", "arguments_sha256", "status", "requested_at", "resolved_at", "comment", "expires_at", "resolved_by", "edited_arguments"],
        "properties": {
            "id": {"type": "string", "pattern": format!("^apr_{ULID}$")},
            "kind": {"type": "string", "enum": [ApprovalKind::Action.as_str(), ApprovalKind::ToolCall.as_str()], "description": "`action`: words only (the script agent). `tool_call`: a defined agent's tool call, shown exactly."},
            "action": {"type": "string", "description": "In plain words, what approving does."},
            "tool": {"type": ["string", "null"], "description": "The tool a tool_call calls."},
            "arguments": {"type": ["object", "null"], "additionalProperties": true, "description": "The arguments the model proposed."},
            "arguments_sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$", "description": "Hex SHA-256 of `arguments` serialized per RFC 8785 (the JSON Canonicalization Scheme: any JCS library computes it); send it with a decision to bind the decision to this exact call."},
            "edited_arguments": {"type": ["object", "null"], "additionalProperties": true, "description": "The arguments a person approved instead (decision edit); the tool is called with these."},
            "status": {"type": "string", "enum": approval_statuses},
            "requested_at": timestamp(false),
            "resolved_at": timestamp(true),
            "comment": {"type": ["string", "null"]},
            "expires_at": {"description": "When a pending approval expires: the run then fails.", "anyOf": [timestamp(true)]},
            "resolved_by": {"type": ["string", "null"], "pattern": format!("^key_{ULID}$"), "description": "The id of the API key that approved or rejected it; null while pending and for a cancel or expiry."}
        }
    });
    let mut inbox_entry = approval.clone();
    inbox_entry["properties"]["run_id"] = json!({"type": "string", "pattern": format!("^run_{ULID}$")});
    inbox_entry["properties"]["agent"] = json!({"type": "string"});
    inbox_entry["properties"]["run_status"] = json!({"type": "string", "enum": statuses});
    for key in ["run_id", "agent", "run_status"] {
        inbox_entry["required"].as_array_mut().expect("a list").push(json!(key));
    }
    // The paths come from the route table: an operation without its
    // description here does not compile.
    let mut paths = serde_json::Map::new();
    for route in &ROUTES {
        let spec = match route.operation {
            Operation::Create => operation(
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
                    "409": error_response("The Idempotency-Key was used with a different request.", &[])
                }),
            ),
            Operation::List => operation(
                route.operation_id,
                "List runs, newest first",
                json!([
                    {"name": "status", "in": "query", "required": false, "description": "Only runs in this state. Empty is the same as absent.", "schema": {"type": "string", "enum": statuses.iter().copied().chain([""]).collect::<Vec<_>>()}},
                    {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, {"const": ""}], "default": DEFAULT_LIMIT}},
                    {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status filter.", "schema": {"type": "string"}}
                ]),
                None,
                json!({
                    "200": {
                        "description": "One page of runs.",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunList"}}}
                    }
                }),
            ),
            Operation::Get => operation(
                route.operation_id,
                "Get a run",
                json!([run_id]),
                None,
                json!({
                    "200": {
                        "description": "The run.",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}},
                        "links": {
                            "DecideFirstApproval": {
                                "operationId": "decideApproval",
                                "parameters": {"run_id": "$response.body#/id", "approval_id": "$response.body#/pending_approvals/0/id"}
                            }
                        }
                    },
                    "404": not_found
                }),
            ),
            Operation::Cancel => operation(
                route.operation_id,
                "Cancel a run",
                json!([run_id]),
                Some(
                    json!({"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CancelRun"}}}}),
                ),
                json!({"200": run_response("The run, canceled.", json!({})), "404": not_found.clone(), "409": conflict}),
            ),
            Operation::Decide => operation(
                route.operation_id,
                "Approve, edit or reject an approval",
                json!([run_id, approval_id]),
                Some(
                    json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Decision"}}}}),
                ),
                json!({
                    "200": run_response("The run as it is now.", json!({})),
                    "404": not_found.clone(),
                    "409": error_response("The approval was decided otherwise, has expired, or arguments_sha256 is not its digest; nothing changed.", &[])
                }),
            ),
            Operation::Extend => operation(
                route.operation_id,
                "Give a pending approval more time",
                json!([run_id, approval_id]),
                Some(
                    json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Extension"}}}}),
                ),
                json!({
                    "200": run_response("The run, with the approval's new expires_at (never earlier than it was).", json!({})),
                    "404": not_found.clone(),
                    "409": error_response("The approval is not pending (an expired one never runs).", &[])
                }),
            ),
            Operation::Inbox => operation(
                route.operation_id,
                "List approvals across runs, newest requested first",
                json!([
                    {"name": "status", "in": "query", "required": false, "description": "Only approvals in this state (default pending). Empty is the same as absent.", "schema": {"type": "string", "enum": approval_statuses.iter().copied().chain([""]).collect::<Vec<_>>(), "default": "pending"}},
                    {"name": "agent", "in": "query", "required": false, "description": "Only approvals of runs of this agent. Empty is the same as absent.", "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]*$"}},
                    {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": inbox::MAX_LIMIT}, {"const": ""}], "default": inbox::DEFAULT_LIMIT}},
                    {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status and agent filters.", "schema": {"type": "string"}}
                ]),
                None,
                json!({
                    "200": {
                        "description": "One page of approvals.",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApprovalList"}}}
                    }
                }),
            ),
            Operation::DecideBatch => operation(
                route.operation_id,
                "Decide up to 100 approvals across runs, all or nothing",
                json!([]),
                Some(
                    json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DecisionBatch"}}}}),
                ),
                json!({
                    "200": {
                        "description": "Every decision recorded (repeats as repeats): the run of each, in request order.",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["data"],
                            "properties": {"data": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}}}
                        }}}
                    },
                    "404": error_response("A run or approval of the batch does not exist for this key's owner; error.index names the element. Nothing was recorded.", &[]),
                    "409": error_response("A decision of the batch cannot be recorded (see decideApproval); error.index names it. Nothing was recorded.", &[])
                }),
            ),
            Operation::Events => operation(
                route.operation_id,
                "List a run's events, oldest first; wait for new ones",
                json!([
                    run_id,
                    {"name": "after", "in": "query", "required": false, "description": "Only events with a higher seq; at most one past the run's last seq. Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": ""}], "default": 0}},
                    {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": events::MAX_LIMIT}, {"const": ""}], "default": events::DEFAULT_LIMIT}},
                    {"name": "wait", "in": "query", "required": false, "description": "Seconds to hold the request while nothing newer than `after` exists. Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": events::MAX_WAIT_SECS}, {"const": ""}], "default": 0}},
                    {"name": "Last-Event-ID", "in": "header", "required": false, "description": "Resume after this seq, as an SSE client does on reconnecting; it wins over `after`.", "schema": {"type": "string", "pattern": "^[0-9]+$"}}
                ]),
                None,
                json!({
                    "200": {
                        "description": "A page of events; with Accept: text/event-stream on the embedded server, a stream of them (`id: <seq>`, `event: <type>`, `data: <event>`, a comment every 15 s, closed after the run's last event).",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/EventList"}},
                            "text/event-stream": {"schema": {"type": "string"}}
                        }
                    },
                    "204": {
                        "description": "With Accept: text/event-stream: the run has ended and its last event was seen; nothing will come (an EventSource stops reconnecting).",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}}
                    },
                    "404": not_found
                }),
            ),
            Operation::CreateWebhook => {
                let mut created = webhook_response(
                    "The endpoint, with its signing secret (shown only here and by rotate-secret).",
                    true,
                );
                let by_id = |operation_id: &str| json!({"operationId": operation_id, "parameters": {"webhook_id": "$response.body#/id"}});
                created["links"] = json!({
                    "GetWebhook": by_id("getWebhook"),
                    "ListWebhookDeliveries": by_id("listWebhookDeliveries"),
                    "RotateWebhookSecret": by_id("rotateWebhookSecret"),
                    "DeleteWebhook": by_id("deleteWebhook")
                });
                operation(
                    route.operation_id,
                    "Create a webhook endpoint",
                    json!([]),
                    Some(
                        json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateWebhook"}}}}),
                    ),
                    json!({"201": created}),
                )
            }
            Operation::ListWebhooks => operation(
                route.operation_id,
                "List webhook endpoints, newest first",
                page_parameters.clone(),
                None,
                json!({"200": {
                    "description": "One page of endpoints (no secrets).",
                    "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/WebhookList"}}}
                }}),
            ),
            Operation::GetWebhook => operation(
                route.operation_id,
                "Get a webhook endpoint",
                json!([webhook_id]),
                None,
                json!({"200": webhook_response("The endpoint (no secret).", false), "404": webhook_not_found.clone()}),
            ),
            Operation::DeleteWebhook => operation(
                route.operation_id,
                "Delete a webhook endpoint",
                json!([webhook_id]),
                None,
                json!({
                    "200": {
                        "description": "Deleted: deliveries not yet made are dropped.",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Deleted"}}}
                    },
                    "404": webhook_not_found.clone()
                }),
            ),
            Operation::RotateWebhookSecret => operation(
                route.operation_id,
                "Rotate a webhook endpoint's signing secret",
                json!([webhook_id]),
                Some(
                    json!({"required": false, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false, "maxProperties": 0}}}}),
                ),
                json!({
                    "200": webhook_response("The endpoint with its new secret. For 24 hours deliveries carry a signature with the old secret too.", true),
                    "404": webhook_not_found.clone(),
                    "409": error_response("Another rotation happened at the same moment; its answer holds the secret.", &[])
                }),
            ),
            Operation::ListWebhookDeliveries => operation(
                route.operation_id,
                "List a webhook endpoint's delivery attempts, newest first",
                json!([webhook_id, page_parameters[0], page_parameters[1]]),
                None,
                json!({
                    "200": {
                        "description": "One page of attempts (kept 30 days).",
                        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeliveryList"}}}
                    },
                    "404": webhook_not_found.clone()
                }),
            ),
        };
        let mut spec = spec;
        // The scope the key needs, from the route table (role names of a
        // bearer scheme, as OpenAPI 3.1 allows).
        spec["security"] = json!([{"bearer": [route.scope.as_str()]}]);
        let methods = paths.entry(route.path).or_insert_with(|| json!({}));
        methods[route.method.as_str().to_ascii_lowercase()] = spec;
    }
    paths.insert(
        PATH.into(),
        json!({
            "get": {
                "operationId": "getOpenApi",
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object", "additionalProperties": true}}}}}
            }
        }),
    );
    let mut document = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Agent Runs API",
            "version": "1.0.0",
            "description": "Start runs of a managed agent, poll them, list them newest first, cancel them, and approve or reject the actions they ask for. Every response, errors included, is JSON and carries x-request-id."
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An API key: `ark_` and at least 40 base62 characters."}
            },
            "headers": {
                "RequestId": header("Identifies the request in the service's logs.", json!({"type": "string"})),
                "RetryAfter": header("Seconds to wait before retrying.", json!({"type": "integer", "minimum": 1}))
            },
            "responses": {
                "InvalidRequest": error_response("The request is malformed or breaks a rule; error.param names the field or parameter.", &[]),
                "Unauthorized": error_response("No usable API key.", &[("WWW-Authenticate", header("Always `Bearer`.", json!({"type": "string", "enum": ["Bearer"]})))]),
                "NotFound": error_response("No such run or approval for this API key's owner.", &[])
            },
            "schemas": {
                "Run": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["id", "status", "agent", "input", "output", "error", "pending_approvals", "metadata", "created_by", "created_at", "started_at", "completed_at"],
                    "properties": {
                        "id": {"type": "string", "pattern": format!("^run_{ULID}$")},
                        "status": {"type": "string", "enum": statuses},
                        "agent": {"type": "string"},
                        "input": {"type": "string"},
                        "output": {"type": ["string", "null"], "description": "Set once the run has succeeded."},
                        "error": {"type": ["string", "null"], "description": "Set once the run has failed."},
                        "pending_approvals": {"type": "array", "items": {"$ref": "#/components/schemas/Approval"}, "description": "Every approval the run asked for, oldest first, whatever its status."},
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        "created_by": {"type": ["string", "null"], "pattern": format!("^key_{ULID}$"), "description": "The id of the API key that created the run; null for runs from before keys were recorded."},
                        "created_at": timestamp(false),
                        "started_at": timestamp(true),
                        "completed_at": timestamp(true),
                        "usage": usage,
                        "budget": budget("The run's own budget, as created: present only when it was given one."),
                        "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$", "description": "Present when the deployment exports traces (OpenTelemetry): the run's trace. the spans of the request that created it, of each attempt, model and tool call, approval wait and change, and the log lines of every process that worked on it, carry this id. The caller's own trace when the create request had a `traceparent` header."}
                    }
                },
                "Approval": approval,
                "InboxEntry": inbox_entry,
                "ApprovalList": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["data", "next_cursor"],
                    "properties": {
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/InboxEntry"}},
                        "next_cursor": {"type": ["string", "null"], "description": "null exactly when no further approval matched."}
                    }
                },
                "RunList": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["data", "next_cursor"],
                    "properties": {
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
                        "next_cursor": {"type": ["string", "null"], "description": "null exactly when no further run matched."}
                    }
                },
                "Event": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["id", "seq", "run_id", "type", "created_at", "data"],
                    "properties": {
                        "id": {"type": "string", "pattern": format!("^evt_{ULID}$")},
                        "seq": {"type": "integer", "minimum": 1, "description": "1 for the run's first event, one more for each next: a gap means a missed event."},
                        "run_id": {"type": "string", "pattern": format!("^run_{ULID}$")},
                        "type": {"type": "string", "enum": EVENT_TYPES},
                        "created_at": timestamp(false),
                        "data": {"type": "object", "additionalProperties": true, "description": "By type: the run (run.created and the terminal ones), the approval (approval.*), attempt, approval_ids, text with truncated, and the rest as docs/api.md lists."}
                    }
                },
                "EventList": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["data", "next_after", "has_more"],
                    "properties": {
                        "data": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
                        "next_after": {"type": "integer", "minimum": 0, "description": "The seq of the last event returned, or `after` when none was."},
                        "has_more": {"type": "boolean", "description": "More events exist beyond this page now."}
                    }
                },
                "CreateRun": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["input"],
                    "properties": {
                        "input": {"type": "string", "minLength": 1, "maxLength": MAX_INPUT_BYTES, "description": format!("1 to {MAX_INPUT_BYTES} bytes of UTF-8. The agent may reject it (400).")},
                        "agent": {"type": ["string", "null"], "minLength": 1, "examples": agents, "description": format!("A built-in agent ({}) or one the operator defined with `agent-runs agents put`; an unknown name is 400. Default: {default_agent}.", agents.join(", "))},
                        "metadata": {
                            "type": ["object", "null"],
                            "maxProperties": MAX_METADATA_KEYS,
                            "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY_CHARS},
                            "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS}
                        },
                        "budget": budget("Limits for this run, each no higher than the agent's own (400 otherwise). Checked before every model and tool call; when spent the run fails with an error starting `budget exceeded:`.")
                    }
                },
                "CancelRun": {"type": "object", "additionalProperties": false, "maxProperties": 0},
                "Decision": decision_schema(&[]),
                "DecisionBatch": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["decisions"],
                    "properties": {
                        "decisions": {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": batch::MAX_DECISIONS,
                            "description": "Each approval at most once.",
                            "items": decision_schema(&[
                                ("run_id", json!({"type": "string", "pattern": format!("^run_{ULID}$")})),
                                ("approval_id", json!({"type": "string", "pattern": format!("^apr_{ULID}$")}))
                            ])
                        }
                    }
                },
                "Extension": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["seconds"],
                    "properties": {
                        "seconds": {"type": "integer", "minimum": 60, "maximum": 604_800, "description": "expires_at becomes now plus this (never earlier than it was)."}
                    }
                },
                "Error": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["error"],
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string", "enum": codes},
                                "message": {"type": "string"},
                                "param": {"type": "string", "description": "The offending field, query parameter or header."},
                                "index": {"type": "integer", "minimum": 0, "description": "In a batch's answer: the 0-based position of the decision that failed."}
                            }
                        }
                    }
                }
            }
        }
    });
    let schemas = document["components"]["schemas"].as_object_mut().expect("an object");
    schemas.extend(webhook_schemas());
    document
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::agents::AgentRegistry;
    use crate::domain::{Approval, ApprovalId, ExecutionPolicy, Owner, Run, RunId, Timestamp};
    use crate::views::RunView;

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
        let committed: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
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
        run.approvals.push(Approval {
            id: ApprovalId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_124, 2)),
            action: "a".into(),
            call: None,
            status: ApprovalStatus::Pending,
            requested_at: Timestamp::from_millis(1_795_303_478_124),
            resolved_at: None,
            comment: None,
            expires_at: None,
            expiry_warned: false,
            resolved_by: None,
            edited_arguments: None,
        });
        let view = serde_json::to_value(RunView::from(&run)).unwrap();
        let schemas = &builtin()["components"]["schemas"];
        assert_eq!(keys(&view), required(&schemas["Run"]));
        // A run whose model reported tokens has `usage` too, and one created
        // with a budget `budget`; both are optional.
        run.usage = Some(Default::default());
        run.budget = crate::domain::Budget { max_total_tokens: Some(5), max_tool_calls: None };
        let with_usage = serde_json::to_value(RunView::from(&run)).unwrap();
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
        assert_eq!(codes.as_array().unwrap().len(), 12);
        let statuses = &document["paths"]["/v1/agent/runs"]["get"]["parameters"][0]["schema"]["enum"];
        assert_eq!(statuses.as_array().unwrap().len(), RunStatus::ALL.len() + 1, "the six states and empty");
        let agents = &document["components"]["schemas"]["CreateRun"]["properties"]["agent"]["examples"];
        assert_eq!(agents, &json!(["echo", "script"]));
    }
}
