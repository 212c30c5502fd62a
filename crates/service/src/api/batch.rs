//! `POST /v1/approvals/batch`: up to 100 decisions across runs, all or
//! nothing. An element that fails is answered as its own error would be,
//! with `error.index`.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::body::{json_object, optional_string, reject_unknown_fields};
use super::decide::{DECISION_FIELDS, DecisionBody, already_decided, approval_not_found, refused};
use super::openapi::{Parts, error_response, operation};
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse};
use crate::auth::Principal;
use crate::commands::{BatchDecision, RunCommands};
use agent_runs_domain::{ApprovalId, RunId, Scope};
use agent_runs_ports::views::{ExtraFields, RunView};

pub const MAX_DECISIONS: usize = 100;

/// One element as sent, parsed.
struct Element {
    run_id: RunId,
    approval_id: ApprovalId,
    body: DecisionBody,
}

fn parse_element(value: Value) -> Result<Element, ApiError> {
    let Value::Object(mut fields) = value else {
        return Err(ApiError::invalid("decisions", "Each decision must be a JSON object."));
    };
    let known: Vec<&str> = ["run_id", "approval_id"].into_iter().chain(DECISION_FIELDS).collect();
    reject_unknown_fields(&fields, &known)?;
    let required = |field: &'static str, text: Option<String>| {
        text.ok_or_else(|| ApiError::invalid(field, format!("`{field}` is required.")))
    };
    let run_id = required("run_id", optional_string(&mut fields, "run_id")?)?;
    let approval_id = required("approval_id", optional_string(&mut fields, "approval_id")?)?;
    let body = DecisionBody::parse(&mut fields)?;
    Ok(Element {
        run_id: run_id.parse().map_err(|_| ApiError::run_not_found())?,
        approval_id: approval_id.parse().map_err(|_| approval_not_found())?,
        body,
    })
}

pub(super) async fn handle(
    commands: &RunCommands,
    shown: ExtraFields,
    by: &Principal,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["decisions"])?;
    let count = || format!("`decisions` must be a list of 1 to {MAX_DECISIONS} decisions.");
    let elements = match body.remove("decisions") {
        Some(Value::Array(elements)) if (1..=MAX_DECISIONS).contains(&elements.len()) => elements,
        _ => return Err(ApiError::invalid("decisions", count())),
    };
    let mut parsed: Vec<Element> = Vec::with_capacity(elements.len());
    for (index, element) in elements.into_iter().enumerate() {
        let element = match parse_element(element) {
            Ok(element) => element,
            Err(error) => return Ok(error.into_response_at(index)),
        };
        if parsed.iter().any(|earlier| (earlier.run_id, earlier.approval_id) == (element.run_id, element.approval_id)) {
            let twice = ApiError::invalid("approval_id", "This approval is already decided earlier in the batch.");
            return Ok(twice.into_response_at(index));
        }
        parsed.push(element);
    }

    let decisions: Vec<BatchDecision> = parsed
        .into_iter()
        .enumerate()
        .map(|(index, element)| BatchDecision {
            index,
            run_id: element.run_id,
            approval_id: element.approval_id,
            request: element.body.request(by.key_id),
        })
        .collect();
    let names: Vec<(RunId, &'static str)> =
        decisions.iter().map(|decision| (decision.run_id, decision.request.decision.name())).collect();
    match commands.decide_batch(by, decisions).await {
        Ok(recorded) => {
            let data: Vec<RunView> = names
                .iter()
                .filter_map(|(run_id, _)| recorded.iter().find(|run| run.id == *run_id))
                .map(|run| RunView::new(run, shown))
                .collect();
            Ok(json_response(StatusCode::OK, &serde_json::json!({ "data": data })))
        }
        Err(failed) => {
            // Without an element, the store failed: repeating the batch is safe.
            let Some(index) = failed.index else {
                return Err(refused(failed.error, |status| format!("An approval is already {}.", status.as_str())));
            };
            let name = names[index].1;
            let mut error = refused(failed.error, |status| already_decided(status, name));
            if failed.partly_recorded
                && let ApiError::Conflict(message)
                | ApiError::NotFound(message)
                | ApiError::Forbidden(message)
                | ApiError::InvalidRequest { message, .. } = &mut error
            {
                message.push_str(
                    " The decisions on some other runs of this batch were recorded: another change came between the writes of a batch too large for one transaction.",
                );
            }
            Ok(error.into_response_at(index))
        }
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::DecideBatch,
    method: Method::POST,
    path: "/v1/approvals/batch",
    operation_id: "decideApprovals",
    function: "decide-batch",
    handler: Handler::Keyed {
        scope: Scope::ApprovalsDecide,
        handle: |api, call| Box::pin(handle(&api.commands, api.shown, call.by, call.request)),
    },
    describe: Some(describe),
};

fn describe(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
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
    )
}
