//! `POST /v1/agent/runs/{run_id}/approvals/{approval_id}`: approve, reject,
//! edit or answer. The parsing and checks here serve the batch too.

use bytes::Bytes;
use http::{Method, Request};
use serde_json::{Map, Value, json};

use super::body::{json_object, optional_string, reject_unknown_fields};
use super::openapi::{Parts, error_response, operation, run_response};
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse, changed_run_response, parse_run_id};
use crate::auth::Principal;
use crate::commands::{DecideRefused, RunCommands};
use agent_runs_domain::{
    ApprovalId, ApprovalKind, ApprovalStatus, Comment, Decision, DecisionRequest, KeyId, MAX_ANSWER_BYTES,
    MAX_APPROVAL_ARGUMENTS_BYTES, MAX_APPROVAL_ARGUMENTS_PER_RUN, RunId, Scope, TransitionError, canonical_json,
    exact_canonical,
};
use agent_runs_ports::store::ChangeError;
use agent_runs_ports::views::ExtraFields;

pub(super) const DECISION_FIELDS: [&str; 5] = ["decision", "comment", "arguments", "arguments_sha256", "answer"];

pub(super) fn approval_not_found() -> ApiError {
    ApiError::NotFound("The run has no approval with that id.".into())
}

/// A decision as its body states it, before it is checked against the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DecisionBody {
    decision: Decision,
    comment: Option<String>,
    seen_sha256: Option<String>,
}

/// `value` (the field `param`) as it is kept: in canonical form, its
/// numbers exact, at most `max_bytes` as JSON.
fn kept_json(param: &'static str, value: &Value, max_bytes: usize) -> Result<Value, ApiError> {
    let kept = exact_canonical(value).map_err(|problem| ApiError::invalid(param, problem))?;
    if canonical_json(&kept).len() > max_bytes {
        return Err(ApiError::invalid(param, format!("`{param}` may be at most {max_bytes} bytes as JSON.")));
    }
    Ok(kept)
}

impl DecisionBody {
    /// Reads the decision fields, removing them from `body`.
    pub(super) fn parse(body: &mut Map<String, Value>) -> Result<DecisionBody, ApiError> {
        let decision = body.remove("decision");
        let arguments = body.remove("arguments").filter(|value| !value.is_null());
        // Any JSON is an answer, `null` included; the question's schema
        // says which.
        let answer = body.remove("answer");
        match (decision.as_ref().and_then(Value::as_str), &answer) {
            (Some("answer"), None) => {
                return Err(ApiError::invalid("answer", "`answer` is required with \"answer\": the person's answer."));
            }
            (Some("answer"), Some(_)) if arguments.is_some() => {
                return Err(ApiError::invalid("arguments", "`arguments` goes only with the decision \"edit\"."));
            }
            (Some(other), Some(_)) if other != "answer" => {
                return Err(ApiError::invalid("answer", "`answer` goes only with the decision \"answer\"."));
            }
            _ => {}
        }
        let decision = match (decision.as_ref().and_then(Value::as_str), arguments) {
            (Some("answer"), None) => {
                Decision::Answer(kept_json("answer", &answer.unwrap_or_default(), MAX_ANSWER_BYTES)?)
            }
            (Some("edit"), Some(Value::Object(fields))) => {
                Decision::Edit(kept_json("arguments", &Value::Object(fields), MAX_APPROVAL_ARGUMENTS_BYTES)?)
            }
            (Some("edit"), Some(_)) => {
                return Err(ApiError::invalid("arguments", "`arguments` must be a JSON object."));
            }
            (Some("edit"), None) => {
                return Err(ApiError::invalid("arguments", "`arguments` is required with \"edit\": the call to make."));
            }
            (Some("approve" | "reject"), Some(_)) => {
                return Err(ApiError::invalid("arguments", "`arguments` goes only with the decision \"edit\"."));
            }
            (Some("approve"), None) => Decision::Approve,
            (Some("reject"), None) => Decision::Reject,
            _ if decision.is_none() || decision == Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "decision",
                    "`decision` is required: \"approve\", \"reject\", \"edit\" or \"answer\".",
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    "decision",
                    "`decision` must be \"approve\", \"reject\", \"edit\" or \"answer\".",
                ));
            }
        };
        let comment = optional_string(body, "comment")?
            .map(|text| Comment::parse(text).map_err(|error| ApiError::invalid("comment", error.0)))
            .transpose()?
            .map(Comment::into_string);
        let seen_sha256 = optional_string(body, "arguments_sha256")?
            .map(|digest| {
                let hex = digest.len() == 64 && digest.bytes().all(|byte| byte.is_ascii_hexdigit());
                hex.then(|| digest.to_ascii_lowercase()).ok_or_else(|| {
                    ApiError::invalid("arguments_sha256", "`arguments_sha256` must be 64 hexadecimal characters.")
                })
            })
            .transpose()?;
        Ok(DecisionBody { decision, comment, seen_sha256 })
    }

    /// The decision as `by` makes it.
    pub(super) fn request(self, by: KeyId) -> DecisionRequest {
        DecisionRequest {
            decision: self.decision,
            comment: self.comment,
            seen_sha256: self.seen_sha256,
            decided_by: Some(by),
        }
    }
}

fn nothing_to_edit(kind: ApprovalKind) -> String {
    match kind {
        ApprovalKind::Input => not_approved(),
        kind => format!("Only a `tool_call` approval can be edited; this one is an `{}`.", kind.as_str()),
    }
}

fn not_approved() -> String {
    "This approval is a question (`input`): answer it (\"answer\" with `answer`) or decline it (\"reject\").".to_owned()
}

pub(super) fn already_decided(status: ApprovalStatus, decision: &str) -> String {
    format!("The approval is already {}; the decision \"{decision}\" differs from the one recorded.", status.as_str())
}

/// The path's run and approval ids; a malformed one names nothing, `404`.
pub(super) fn parse_approval_path(run_id: &str, approval_id: &str) -> Result<(RunId, ApprovalId), ApiError> {
    Ok((parse_run_id(run_id)?, approval_id.parse().map_err(|_| approval_not_found())?))
}

/// The answer to a change of an approval the lifecycle refused; `decided`
/// says why an approval that is no longer pending refuses it.
pub(super) fn refused(error: ChangeError<DecideRefused>, decided: impl Fn(ApprovalStatus) -> String) -> ApiError {
    match error {
        ChangeError::Gone => ApiError::run_not_found(),
        ChangeError::Refused(DecideRefused::SameKeyAsCreator { agent }) => ApiError::Forbidden(format!(
            "The agent `{agent}` wants its runs' approvals decided by another API key than the one that created the run."
        )),
        ChangeError::Refused(DecideRefused::NothingToEdit(kind)) => {
            ApiError::invalid("decision", nothing_to_edit(kind))
        }
        ChangeError::Refused(DecideRefused::ArgumentsRefused(problem)) => ApiError::invalid("arguments", problem),
        ChangeError::Refused(DecideRefused::Expired) => ApiError::Conflict(
            "The approval expired before this request arrived: its action never runs, and the run fails.".into(),
        ),
        ChangeError::Refused(DecideRefused::Transition(TransitionError::NoSuchApproval)) => approval_not_found(),
        ChangeError::Refused(DecideRefused::Transition(TransitionError::ArgumentsChanged)) => ApiError::Conflict(
            "`arguments_sha256` is not the approval's: the decision was made for another call. Nothing was changed."
                .into(),
        ),
        ChangeError::Refused(DecideRefused::Transition(TransitionError::NothingToEdit)) => {
            ApiError::invalid("decision", nothing_to_edit(ApprovalKind::Action))
        }
        ChangeError::Refused(DecideRefused::Transition(TransitionError::NotAQuestion)) => ApiError::invalid(
            "decision",
            "Only a question (an `input` approval) is answered; approve, edit or reject this one.",
        ),
        ChangeError::Refused(DecideRefused::Transition(TransitionError::QuestionNeedsAnAnswer)) => {
            ApiError::invalid("decision", not_approved())
        }
        ChangeError::Refused(DecideRefused::Transition(TransitionError::AnswerRefused(problem))) => {
            ApiError::invalid("answer", problem)
        }
        ChangeError::Refused(DecideRefused::Transition(TransitionError::TooManyArguments)) => ApiError::invalid(
            "arguments",
            format!(
                "The run's approvals would hold more than a run may ({MAX_APPROVAL_ARGUMENTS_PER_RUN} bytes as JSON); approve or reject the call as proposed, or send a shorter answer."
            ),
        ),
        ChangeError::Refused(DecideRefused::Transition(TransitionError::ApprovalAlreadyResolved(status))) => {
            ApiError::Conflict(decided(status))
        }
        ChangeError::Refused(DecideRefused::Transition(other)) => {
            ApiError::Conflict(format!("The approval cannot be changed: {other}."))
        }
        ChangeError::Store(error) => error.into(),
    }
}

pub(super) async fn handle(
    commands: &RunCommands,
    shown: ExtraFields,
    by: &Principal,
    run_id: &str,
    approval_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let (run_id, approval_id) = parse_approval_path(run_id, approval_id)?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &DECISION_FIELDS)?;
    let request = DecisionBody::parse(&mut body)?.request(by.key_id);
    let name = request.decision.name();
    match commands.decide(by, run_id, approval_id, request).await {
        Ok(run) => Ok(changed_run_response(&run, shown)),
        Err(error) => Err(refused(error, |status| already_decided(status, name))),
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Decide,
    method: Method::POST,
    path: "/v1/agent/runs/{run_id}/approvals/{approval_id}",
    operation_id: "decideApproval",
    function: "decide",
    handler: Handler::Keyed {
        scope: Scope::ApprovalsDecide,
        handle: |api, call| {
            Box::pin(handle(
                &api.commands,
                api.shown,
                call.by,
                call.param("run_id"),
                call.param("approval_id"),
                call.request,
            ))
        },
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { run_id, approval_id, not_found, .. } = parts;
    operation(
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
    )
}
