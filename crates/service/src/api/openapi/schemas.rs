//! The document around the paths: its metadata, security scheme and the
//! schemas of what the operations take and give.

use serde_json::{Value, json};

use super::{Parts, ULID, budget, decision_schema, error_response, header, policy_schemas, timestamp, webhook_schemas};
use crate::api::batch;
use agent_runs_domain::{
    EVENT_TYPES, MAX_INPUT_BYTES, MAX_METADATA_KEY_CHARS, MAX_METADATA_KEYS, MAX_METADATA_VALUE_CHARS,
};

pub(super) fn document(paths: serde_json::Map<String, Value>, parts: &Parts<'_>) -> Value {
    let Parts { agents, default_agent, statuses, codes, usage, approval, inbox_entry, .. } = parts;
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
                    "required": ["id", "status", "agent", "input", "output", "error", "pending_approvals", "metadata", "thread_id", "previous_run_id", "created_by", "created_at", "started_at", "completed_at"],
                    "properties": {
                        "id": {"type": "string", "pattern": format!("^run_{ULID}$")},
                        "status": {"type": "string", "enum": statuses},
                        "agent": {"type": "string"},
                        "input": {"type": "string"},
                        "output": {"type": ["string", "null"], "description": "Set once the run has succeeded."},
                        "error": {"type": ["string", "null"], "description": "Set once the run has failed."},
                        "pending_approvals": {"type": "array", "items": {"$ref": "#/components/schemas/Approval"}, "description": "Every approval the run asked for, oldest first, whatever its status."},
                        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                        "thread_id": {"type": "string", "pattern": format!("^run_{ULID}$"), "description": "The id of the conversation's first run: the run's own id unless it continues another."},
                        "previous_run_id": {"type": ["string", "null"], "pattern": format!("^run_{ULID}$"), "description": "The run this one continues; null when it continues none."},
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
                        "budget": budget("Limits for this run, each no higher than the agent's own (400 otherwise). Checked before every model and tool call; when spent the run fails with an error starting `budget exceeded:`."),
                        "previous_run_id": {"type": ["string", "null"], "pattern": format!("^run_{ULID}$"), "description": "Continue this ended run's conversation (a defined agent's model sees its messages, then this input). Not the owner's: 404; `agent` named and not that run's: 400 (left out, that run's agent is used); not ended: 409."}
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
    schemas.extend(policy_schemas());
    document
}
