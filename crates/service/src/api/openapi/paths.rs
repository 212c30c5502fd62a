//! Each operation's description, for its route of the route table: an
//! operation without one here does not compile.

use serde_json::{Value, json};

use super::{Parts, ULID, error_response, header, operation, run_response, webhook_response};
use crate::api::list::{DEFAULT_LIMIT, MAX_LIMIT};
use crate::api::routes::{Operation, Route};
use crate::api::{events, inbox};
use agent_runs_domain::MAX_IDEMPOTENCY_KEY_CHARS;

pub(super) fn spec(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts {
        statuses,
        approval_statuses,
        run_id,
        approval_id,
        not_found,
        webhook_id,
        webhook_not_found,
        page_parameters,
        conflict,
        links,
        ..
    } = parts;
    match route.operation {
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
                "404": error_response("`previous_run_id` names no run of this API key's owner.", &[]),
                "409": error_response("The Idempotency-Key was used with a different request, or the run `previous_run_id` names has not ended.", &[])
            }),
        ),
        Operation::List => operation(
            route.operation_id,
            "List runs, newest first",
            json!([
                {"name": "status", "in": "query", "required": false, "description": "Only runs in this state. Empty is the same as absent.", "schema": {"type": "string", "enum": statuses.iter().copied().chain([""]).collect::<Vec<_>>()}},
                {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, {"const": ""}], "default": DEFAULT_LIMIT}},
                {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status and thread filters.", "schema": {"type": "string"}},
                {"name": "thread_id", "in": "query", "required": false, "description": "Only the runs of this conversation (a run's `thread_id`): its first run and every run continuing it, newest first. Another owner's thread is an empty page. Empty is the same as absent.", "schema": {"type": "string", "pattern": format!("^(run_{ULID})?$")}}
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
                {"name": "kind", "in": "query", "required": false, "description": "Only approvals of this kind (`input`: questions). Empty is the same as absent.", "schema": {"type": "string", "enum": ["action", "tool_call", "input", ""]}},
                {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": inbox::MAX_LIMIT}, {"const": ""}], "default": inbox::DEFAULT_LIMIT}},
                {"name": "cursor", "in": "query", "required": false, "description": "A next_cursor from an earlier page, with the same status, agent and kind filters.", "schema": {"type": "string"}}
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
            let mut created =
                webhook_response("The endpoint, with its signing secret (shown only here and by rotate-secret).", true);
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
        Operation::GetPolicy => operation(
            route.operation_id,
            "Get the owner's approval policy",
            json!([]),
            None,
            json!({"200": policy_response("The policy in force (version 0 and no rules until the first put).")}),
        ),
        Operation::PutPolicy => operation(
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
                "200": policy_response("The new policy, one version on."),
                "409": error_response("Other puts kept coming first; send it again.", &[]),
                "412": error_response("The policy is no longer at the version If-Match names.", &[])
            }),
        ),
        Operation::ListKeys => operation(
            route.operation_id,
            "List the owner's API keys, oldest first",
            json!([]),
            None,
            json!({"200": {
                "description": "The owner's keys (the first 1,000, and always the caller's own), revoked ones too: ids, names and scopes, never a secret. On DynamoDB another key made a moment ago may take a second to appear.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyList"}}}
            }}),
        ),
        Operation::GetAgent => operation(
            route.operation_id,
            "Get what a client may know of an agent",
            json!([{"name": "agent", "in": "path", "required": true, "schema": {"type": "string"}}]),
            None,
            json!({
                "200": {
                    "description": "The agent's name, description and whether its approvals need another key than the run's creator.",
                    "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Agent"}}}
                },
                "404": error_response("No agent of that name.", &[])
            }),
        ),
        Operation::TestPolicy => operation(
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
        ),
    }
}

fn policy_response(description: &str) -> Value {
    json!({
        "description": description,
        "headers": {
            "x-request-id": {"$ref": "#/components/headers/RequestId"},
            "ETag": header("The policy's version, in quotes: send it as If-Match.", json!({"type": "string"}))
        },
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Policy"}}}
    })
}
