//! The OpenAPI 3.1 document of the contract, built from the same constants,
//! enums and agent registry that the operations use, so it cannot drift
//! from them. `docs/openapi.json` is this document for the built-in agents
//! (a test keeps the file equal to it), and `GET /v1/openapi.json` serves it
//! for the running deployment.

mod schemas;

use bytes::Bytes;
use http::{Method, Request};
use serde_json::{Value, json};

use super::query::no_query;
use super::routes::{FALLBACK_FUNCTION, Handler, Operation, ROUTES, Route, always};
use super::{Api, ApiError, ApiResponse, MAX_BODY_BYTES};
use super::{create, webhooks};
use agent_runs_domain::{
    ApprovalKind, ApprovalStatus, EVENT_TYPES, MAX_ANSWER_BYTES, MAX_APPROVAL_ARGUMENTS_BYTES, MAX_COMMENT_CHARS,
    MAX_DISAGREEMENTS, MAX_RULES, MAX_WEBHOOK_DESCRIPTION_CHARS, MAX_WEBHOOK_URL_BYTES, MAX_WEBHOOKS_PER_OWNER,
    RETRY_DELAYS, RunStatus,
};

pub const PATH: &str = "/v1/openapi.json";

/// `GET /v1/openapi.json`: this document, to anyone.
pub(in crate::api) const ROUTE: Route = Route {
    operation: Operation::OpenApi,
    method: Method::GET,
    path: PATH,
    operation_id: "getOpenApi",
    function: FALLBACK_FUNCTION,
    handler: Handler::Public { handle: |api, request| Box::pin(serve(api, request)), answers: always },
    describe: Some(describe),
};

async fn serve(api: &Api, request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let mut response = http::Response::new(api.openapi.clone());
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    Ok(response)
}

fn describe(route: &Route, _parts: &Parts<'_>) -> Value {
    json!({
        "operationId": route.operation_id,
        "summary": "This document",
        "responses": {
            "200": {"description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object", "additionalProperties": true}}}},
            "400": {"$ref": "#/components/responses/InvalidRequest"}
        }
    })
}

pub(super) const ULID: &str = "[0-7][0-9A-HJKMNP-TV-Z]{25}";
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
        ApiError::PreconditionFailed(String::new()),
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

pub(super) fn header(description: &str, schema: Value) -> Value {
    json!({"description": description, "schema": schema})
}

pub(super) fn error_response(description: &str, extra_headers: &[(&str, Value)]) -> Value {
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

pub(super) fn run_response(description: &str, status_headers: Value) -> Value {
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

pub(super) fn operation(
    id: &str,
    summary: &str,
    parameters: Value,
    body: Option<Value>,
    mut responses: Value,
) -> Value {
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
/// `serde_json` feature). One object, with "`arguments` exactly with edit,
/// `answer` exactly with answer" as nested `if`/`then`/`else`: client generators (openapi-python-client,
/// openapi-typescript) ignore those and see one model, while a `oneOf` of
/// partial objects made openapi-python-client emit a model twice and
/// generate a client that fails at import. Validators still apply the rule.
fn decision_schema(extra: &[(&str, Value)]) -> Value {
    let mut schema = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["decision"],
        "properties": {
            "decision": {"type": "string", "enum": ["approve", "reject", "edit", "answer"], "description": "edit: approve with `arguments` in place of the proposed ones (tool_call approvals only; checked against the tool's JSON Schema). answer: answer a question (input approvals only, which take answer or reject, never approve or edit)."},
            "answer": {"description": format!("With answer, and only with answer (required there): any JSON the question's `input_schema` accepts (400 naming what is wrong otherwise), at most {MAX_ANSWER_BYTES} bytes as JSON.")},
            "comment": {"type": ["string", "null"], "maxLength": MAX_COMMENT_CHARS, "description": "A reject's comment reaches the model as the reason."},
            "arguments": {"type": ["object", "null"], "additionalProperties": true, "description": format!("With edit, and only with edit (required there): the arguments to call the tool with, at most {MAX_APPROVAL_ARGUMENTS_BYTES} bytes as JSON.")},
            "arguments_sha256": {"type": ["string", "null"], "pattern": "^[0-9a-fA-F]{64}$", "description": "The approval's arguments_sha256 as the person saw it; another value is 409 and nothing changes."}
        },
        "if": {"properties": {"decision": {"const": "edit"}}},
        "then": {"required": ["arguments"], "properties": {"arguments": {"type": "object"}}, "not": {"required": ["answer"]}},
        "else": {
            "properties": {"arguments": {"type": "null"}},
            "if": {"properties": {"decision": {"const": "answer"}}},
            "then": {"required": ["answer"]},
            "else": {"not": {"required": ["answer"]}}
        }
    });
    for (name, property) in extra {
        schema["properties"][*name] = property.clone();
        schema["required"].as_array_mut().expect("a list").push(json!(name));
    }
    schema
}

pub(super) fn webhook_response(description: &str, with_secret: bool) -> Value {
    let schema = if with_secret { "WebhookWithSecret" } else { "Webhook" };
    json!({
        "description": description,
        "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

/// A policy, its rules and what a test of rules answers.
fn policy_schemas() -> serde_json::Map<String, Value> {
    // The value's type follows from the op.
    let value_of = |ops: Value, value: Value| json!({"if": {"properties": {"op": ops}, "required": ["op"]}, "then": {"properties": {"value": value}}});
    let condition = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["path", "op", "value"],
        "allOf": [
            value_of(json!({"enum": ["<", "<=", ">", ">="]}), json!({"type": "number"})),
            value_of(json!({"enum": ["in", "not_in"]}), json!({"type": "array"})),
            value_of(json!({"enum": ["prefix", "matches"]}), json!({"type": "string", "maxLength": 1024})),
            value_of(json!({"const": "exists"}), json!({"type": "boolean"}))
        ],
        "properties": {
            "path": {"type": "string", "pattern": "^(/.*)?$", "description": "A JSON Pointer (RFC 6901) into the call's arguments."},
            "op": {"type": "string", "enum": ["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "prefix", "matches", "exists"]},
            "value": {"description": "A number for `<`..`>=`, an array for `in`/`not_in`, a string for `prefix` and `matches` (a regular expression matching the whole string), true or false for `exists`."}
        }
    });
    let rule_properties = json!({
        "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
        "agent": {"type": "string", "minLength": 1, "maxLength": 1024, "default": "*", "description": "A glob: `*` any run of characters, `?` one."},
        "tool": {"type": "string", "minLength": 1, "maxLength": 1024, "default": "*", "description": "A glob over tool names (an MCP tool is `<server>__<tool>`)."},
        "effect": {"type": "string", "enum": ["allow", "deny", "ask"]},
        "mode": {"type": "string", "enum": ["enforce", "log_only"], "default": "enforce"},
        "reason": {"type": ["string", "null"], "maxLength": 500, "description": "Told to the model when the rule denies a call."},
        "when": {"type": "array", "items": {"$ref": "#/components/schemas/PolicyCondition"}, "description": "Every condition must hold."}
    });
    let rules = |items: &str| json!({"type": "array", "maxItems": MAX_RULES, "items": {"$ref": items}});
    let count = json!({"type": "integer", "minimum": 0});
    let tally = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["matched", "agreed", "disagreed"],
        "properties": {"matched": count, "agreed": count, "disagreed": count}
    });
    let schemas = json!({
        "PolicyCondition": condition,
        "PolicyRuleInput": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "effect"],
            "properties": rule_properties
        },
        "PolicyRule": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "agent", "tool", "effect", "mode", "reason", "when"],
            "properties": rule_properties
        },
        "PolicyInput": {
            "type": "object",
            "additionalProperties": false,
            "required": ["rules"],
            "properties": {"rules": rules("#/components/schemas/PolicyRuleInput")}
        },
        "Policy": {
            "type": "object",
            "additionalProperties": false,
            "required": ["version", "rules", "updated_at", "updated_by"],
            "properties": {
                "version": {"type": "integer", "minimum": 0, "description": "0 until the first put; one more with each put. The ETag."},
                "rules": rules("#/components/schemas/PolicyRule"),
                "updated_at": timestamp(true),
                "updated_by": {"type": ["string", "null"], "pattern": format!("^key_{ULID}$")}
            }
        },
        "PolicyTest": {
            "type": "object",
            "additionalProperties": false,
            "required": ["rules"],
            "properties": {
                "rules": rules("#/components/schemas/PolicyRuleInput"),
                "limit": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1_000, "description": "How many of the most recent decisions to replay."}
            }
        },
        "PolicyTestResult": {
            "type": "object",
            "additionalProperties": false,
            "required": ["evaluated", "would_allow", "would_deny", "would_ask", "disagreements", "rules"],
            "properties": {
                "evaluated": count,
                "would_allow": count,
                "would_deny": count,
                "would_ask": count,
                "disagreements": {
                    "type": "array",
                    "maxItems": MAX_DISAGREEMENTS,
                    "items": {
                        "type": "object",
                        "additionalProperties": false,
                        "required": ["run_id", "approval_id", "agent", "tool", "arguments", "human", "rule", "effect"],
                        "properties": {
                            "run_id": {"type": "string", "pattern": format!("^run_{ULID}$")},
                            "approval_id": {"type": "string", "pattern": format!("^apr_{ULID}$")},
                            "agent": {"type": "string"},
                            "tool": {"type": "string"},
                            "arguments": {"description": "As proposed."},
                            "human": {"type": "string", "enum": ["approved", "edited", "rejected"]},
                            "rule": {"type": "string"},
                            "effect": {"type": "string", "enum": ["allow", "deny"]}
                        }
                    }
                },
                "rules": {"type": "object", "additionalProperties": tally}
            }
        },
        "Key": {
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "name", "scopes", "created_at", "revoked_at", "current"],
            "properties": {
                "id": {"type": "string", "pattern": format!("^key_{ULID}$")},
                "name": {"type": ["string", "null"], "description": "The label given at `agent-runs keys create --name`."},
                "scopes": {"type": "array", "items": {"type": "string", "enum": agent_runs_domain::Scope::ALL.map(agent_runs_domain::Scope::as_str)}},
                "created_at": timestamp(false),
                "revoked_at": timestamp(true),
                "current": {"type": "boolean", "description": "The key this request was made with."}
            }
        },
        "KeyList": {
            "type": "object",
            "additionalProperties": false,
            "required": ["data"],
            "properties": {"data": {"type": "array", "maxItems": 1_001, "items": {"$ref": "#/components/schemas/Key"}}}
        },
        "Agent": {
            "type": "object",
            "additionalProperties": false,
            "required": ["name", "description", "separate_approver"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": ["string", "null"]},
                "separate_approver": {"type": "boolean", "description": "The key that created a run may not decide its approvals (403)."}
            }
        }
    });
    match schemas {
        Value::Object(map) => map,
        _ => unreachable!("an object"),
    }
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

/// A run's budget (or a create's), described.
fn budget(description: &str) -> Value {
    json!({
        "type": ["object", "null"],
        "additionalProperties": false,
        "description": description,
        "properties": {
            "max_total_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": create::MAX_BUDGET, "description": "Tokens (input and output) the run may use."},
            "max_tool_calls": {"type": ["integer", "null"], "minimum": 0, "maximum": create::MAX_BUDGET, "description": "Tool calls the run may make."}
        }
    })
}

/// What the paths and the schemas both describe, made once.
pub(crate) struct Parts<'a> {
    pub(crate) agents: &'a [&'a str],
    pub(crate) default_agent: &'a str,
    pub(crate) statuses: Vec<&'static str>,
    pub(crate) approval_statuses: Vec<&'static str>,
    pub(crate) codes: Vec<&'static str>,
    pub(crate) run_id: Value,
    pub(crate) approval_id: Value,
    pub(crate) not_found: Value,
    pub(crate) webhook_id: Value,
    pub(crate) webhook_not_found: Value,
    pub(crate) page_parameters: Value,
    pub(crate) conflict: Value,
    pub(crate) links: Value,
    pub(crate) usage: Value,
    pub(crate) approval: Value,
    pub(crate) inbox_entry: Value,
}

impl<'a> Parts<'a> {
    fn new(agents: &'a [&'a str], default_agent: &'a str) -> Self {
        let statuses: Vec<&'static str> = RunStatus::ALL.iter().map(|status| status.as_str()).collect();
        let approval_statuses: Vec<&'static str> = ApprovalStatus::ALL.iter().map(|status| status.as_str()).collect();
        let codes: Vec<&'static str> = error_codes().into_iter().map(|(_, code)| code).collect();
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
        let approval = json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["id", "kind", "action", "tool", "arguments", "arguments_sha256", "status", "requested_at", "resolved_at", "comment", "expires_at", "resolved_by", "edited_arguments", "policy", "input_schema", "answer", "tool_changed", "auto_approves_at"],
            "properties": {
                "id": {"type": "string", "pattern": format!("^apr_{ULID}$")},
                "kind": {"type": "string", "enum": ApprovalKind::ALL.map(ApprovalKind::as_str), "description": "`action`: words only (the script agent). `tool_call`: a defined agent's tool call, shown exactly. `input`: a question a person answers (decision answer) or declines (reject)."},
                "action": {"type": "string", "description": "In plain words, what approving does; for an input, the question."},
                "input_schema": {"type": ["object", "null"], "additionalProperties": true, "description": "For an input: the JSON Schema the answer must satisfy (`{\"type\": \"string\"}` when the agent gave none); null otherwise."},
                "answer": {"description": "For an input: the answer once given (status answered), any JSON its schema accepts; null otherwise."},
                "auto_approves_at": {"type": ["string", "null"], "format": "date-time", "description": "A veto window: when this approval, still pending, is approved with `resolved_by` `timeout` (the tool's `auto_approve_after_secs` after it was asked; moved by extend, never earlier). A person may approve, edit or reject before. Null without one."},
                "tool_changed": {"type": "boolean", "description": "For a tool call of an MCP server's tool: the tool is new or changed (name, description, input schema or annotations) since `agents put` pinned the server, so a person decides it whatever its annotations or the policy say. False otherwise."},
                "tool": {"type": ["string", "null"], "description": "The tool a tool_call calls."},
                "arguments": {"type": ["object", "null"], "additionalProperties": true, "description": "The arguments the model proposed."},
                "arguments_sha256": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$", "description": "Hex SHA-256 of `arguments` serialized per RFC 8785 (the JSON Canonicalization Scheme: any JCS library computes it); send it with a decision to bind the decision to this exact call."},
                "edited_arguments": {"type": ["object", "null"], "additionalProperties": true, "description": "The arguments a person approved instead (decision edit); the tool is called with these."},
                "status": {"type": "string", "enum": approval_statuses},
                "requested_at": timestamp(false),
                "resolved_at": timestamp(true),
                "comment": {"type": ["string", "null"]},
                "expires_at": {"description": "When a pending approval expires: the run then fails.", "anyOf": [timestamp(true)]},
                "resolved_by": {"type": ["string", "null"], "pattern": format!("^(key_{ULID}|policy:[a-z0-9][a-z0-9_-]{{0,62}}|timeout)$"), "description": "The id of the API key that approved or rejected it, `policy:<rule id>` for a call a rule of the owner's policy decided, or `timeout` for one approved at the end of its veto window (`auto_approves_at`); null while pending and for a cancel or expiry."},
                "policy": {
                    "description": "The rule of the owner's policy that decided the call (an `ask` rule included) or, when none decided, the first matching `log_only` rule with the effect it would have had; null otherwise.",
                    "type": ["object", "null"],
                    "additionalProperties": false,
                    "required": ["rule", "effect", "mode", "version"],
                    "properties": {
                        "rule": {"type": "string"},
                        "effect": {"type": "string", "enum": ["allow", "deny", "ask"]},
                        "mode": {"type": "string", "enum": ["enforce", "log_only"]},
                        "version": {"type": "integer", "minimum": 1}
                    }
                }
            }
        });
        let mut inbox_entry = approval.clone();
        inbox_entry["properties"]["run_id"] = json!({"type": "string", "pattern": format!("^run_{ULID}$")});
        inbox_entry["properties"]["agent"] = json!({"type": "string"});
        inbox_entry["properties"]["run_status"] = json!({"type": "string", "enum": statuses});
        for key in ["run_id", "agent", "run_status"] {
            inbox_entry["required"].as_array_mut().expect("a list").push(json!(key));
        }
        Parts {
            agents,
            default_agent,
            statuses,
            approval_statuses,
            codes,
            run_id,
            approval_id,
            not_found,
            webhook_id,
            webhook_not_found,
            page_parameters,
            conflict,
            links,
            usage,
            approval,
            inbox_entry,
        }
    }
}

/// The document, with `agents` as the values `agent` may take.
pub fn document(agents: &[&str], default_agent: &str) -> Value {
    let parts = Parts::new(agents, default_agent);
    let mut paths = serde_json::Map::new();
    for route in &ROUTES {
        let Some(describe) = route.describe else { continue };
        let mut spec = describe(route, &parts);
        // The scope the key needs, from the route table (role names of a
        // bearer scheme, as OpenAPI 3.1 allows); none for a public route.
        spec["security"] = match route.scope() {
            Some(scope) => json!([{"bearer": [scope.as_str()]}]),
            None => json!([]),
        };
        let methods = paths.entry(route.path).or_insert_with(|| json!({}));
        methods[route.method.as_str().to_ascii_lowercase()] = spec;
    }
    schemas::document(paths, &parts)
}

#[cfg(test)]
mod tests;
