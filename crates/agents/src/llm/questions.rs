//! The `ask_human` tool of a definition with `ask_human = true`: the model
//! asks a person a question, the run parks until it is answered, and the
//! answer (or the refusal) is the tool's result.

use serde_json::{Value, json};

use super::model::ToolSpec;
use agent_runs_domain::{
    ASK_HUMAN_TOOL, Approval, ApprovalStatus, MAX_QUESTION_CHARS, answer_text, check_input_schema, default_input_schema,
};

/// The tool as the model is offered it.
pub(super) fn spec() -> ToolSpec {
    ToolSpec {
        name: ASK_HUMAN_TOOL.into(),
        description: "Ask a person a question and wait for the answer (it may take hours). Use it only for what a \
                      person must decide or only a person knows. The answer is JSON matching `answer_schema` (a JSON \
                      Schema; a string when left out)."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question, in plain words."},
                "answer_schema": {"type": "object", "description": "A JSON Schema the answer must satisfy."}
            },
            "required": ["question"],
            "additionalProperties": false
        }),
    }
}

/// The question and the schema of its answer a call asks, or what is wrong
/// with it in words for the model.
pub(super) fn asked(arguments: &str) -> Result<(String, Value), String> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(text) else {
        return Err("The arguments of ask_human must be a JSON object with `question`.".into());
    };
    let question = match fields.remove("question") {
        Some(Value::String(question)) if !question.trim().is_empty() => question,
        _ => return Err("`question` is required: the question for the person, as a non-empty string.".into()),
    };
    if question.chars().count() > MAX_QUESTION_CHARS {
        return Err(format!("`question` may be at most {MAX_QUESTION_CHARS} characters."));
    }
    let schema = match fields.remove("answer_schema") {
        None | Some(Value::Null) => default_input_schema(),
        Some(schema) => {
            check_input_schema(&schema)?;
            schema
        }
    };
    if let Some(unknown) = fields.keys().next() {
        return Err(format!("ask_human takes `question` and `answer_schema` only, not `{unknown}`."));
    }
    Ok((question, schema))
}

/// What the model is told once the person answered or declined; `None`
/// while the question is open.
pub(super) fn result(approval: &Approval) -> Option<(String, bool)> {
    match (approval.status, &approval.answer) {
        (ApprovalStatus::Answered, Some(answer)) => Some((answer_text(answer), false)),
        (ApprovalStatus::Rejected, _) => {
            let comment =
                approval.comment.as_deref().map(|comment| format!(" Their comment: {comment}")).unwrap_or_default();
            Some((format!("The person declined to answer.{comment}"), true))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_needs_words_and_a_schema_it_can_hold() {
        assert_eq!(asked(r#"{"question": "Which env?"}"#), Ok(("Which env?".into(), default_input_schema())));
        let schema = json!({"enum": ["staging", "prod"]});
        let arguments = json!({"question": "Which env?", "answer_schema": schema}).to_string();
        assert_eq!(asked(&arguments), Ok(("Which env?".into(), schema)));
        for (arguments, problem) in [
            ("[1]", "JSON object"),
            (r#"{"question": ""}"#, "`question` is required"),
            (r#"{"question": "Which?", "answer_schema": "string"}"#, "must be a JSON object"),
            (r#"{"question": "Which?", "answer_schema": {"type": 7}}"#, "not a valid JSON Schema"),
            (r#"{"question": "Which?", "urgent": true}"#, "not `urgent`"),
        ] {
            let refused = asked(arguments).unwrap_err();
            assert!(refused.contains(problem), "{arguments}: {refused}");
        }
        let long = json!({"question": "x".repeat(MAX_QUESTION_CHARS + 1)}).to_string();
        assert!(asked(&long).is_err());
    }
}
