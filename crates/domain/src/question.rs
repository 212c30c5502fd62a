//! Questions a run puts to a person (approvals of kind `input`): the JSON
//! Schema an answer must satisfy, and the answer as an agent reads it.

use serde_json::Value;

use super::{canonical_json, check_exact_numbers};

/// The schema of a question asked without one: any string.
pub fn default_input_schema() -> Value {
    serde_json::json!({"type": "string"})
}

/// The largest schema (as canonical JSON) a question may carry.
pub const MAX_INPUT_SCHEMA_BYTES: usize = 16 * 1024;

/// The largest answer (as canonical JSON) a person may give.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024;

/// The longest question, in characters.
pub const MAX_QUESTION_CHARS: usize = 2_000;

/// Problems of an answer listed at most.
const MAX_PROBLEMS: usize = 5;

/// `schema` if it can be a question's: a valid JSON Schema, an object, of
/// at most [`MAX_INPUT_SCHEMA_BYTES`], its numbers exact. Says what is wrong
/// otherwise.
pub fn check_input_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("The answer schema must be a JSON object (a JSON Schema).".into());
    }
    if canonical_json(schema).len() > MAX_INPUT_SCHEMA_BYTES {
        return Err(format!("The answer schema may be at most {MAX_INPUT_SCHEMA_BYTES} bytes as JSON."));
    }
    check_exact_numbers(schema)?;
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|error| format!("The answer schema is not a valid JSON Schema: {error}"))
}

/// Whether `answer` satisfies `schema`; else what is wrong and where
/// (`at /env: ...`).
pub fn check_answer(schema: &Value, answer: &Value) -> Result<(), String> {
    if canonical_json(answer).len() > MAX_ANSWER_BYTES {
        return Err(format!("The answer may be at most {MAX_ANSWER_BYTES} bytes as JSON."));
    }
    check_exact_numbers(answer)?;
    // A stored schema was checked when it was asked.
    let validator =
        jsonschema::validator_for(schema).map_err(|_| "The question's schema cannot be read.".to_owned())?;
    let problems: Vec<String> = validator
        .iter_errors(answer)
        .take(MAX_PROBLEMS)
        .map(|error| {
            let at = error.instance_path().to_string();
            if at.is_empty() { error.to_string() } else { format!("at {at}: {error}") }
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("The answer does not match the question's schema: {}.", problems.join("; ")))
    }
}

/// An answer as a line of text: a string as it is, anything else as its
/// canonical JSON.
pub fn answer_text(answer: &Value) -> String {
    match answer {
        Value::String(text) => text.clone(),
        other => canonical_json(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_held_to_the_schema_and_problems_name_the_place() {
        let schema = json!({"type": "object", "properties": {"env": {"enum": ["staging", "prod"]}, "count": {"type": "integer"}}, "required": ["env"]});
        assert_eq!(check_input_schema(&schema), Ok(()));
        assert_eq!(check_answer(&schema, &json!({"env": "prod", "count": 2})), Ok(()));
        let problem = check_answer(&schema, &json!({"env": "dev"})).unwrap_err();
        assert!(problem.contains("at /env"), "{problem}");
        let problem = check_answer(&schema, &json!({"count": 1.5})).unwrap_err();
        assert!(problem.contains("env") && problem.contains("/count"), "{problem}");
        assert_eq!(check_answer(&default_input_schema(), &json!("ENG-42")), Ok(()));
        assert!(check_answer(&default_input_schema(), &json!(42)).is_err());
        assert!(check_answer(&default_input_schema(), &json!("x".repeat(MAX_ANSWER_BYTES))).is_err());
        assert!(check_answer(&json!({}), &json!({"n": 12345678901234567891u64})).unwrap_err().contains("string"));
    }

    #[test]
    fn a_schema_must_be_a_bounded_valid_json_schema() {
        assert!(check_input_schema(&json!("string")).is_err());
        assert!(check_input_schema(&json!({"type": "no-such-type"})).unwrap_err().contains("not a valid JSON Schema"));
        assert!(check_input_schema(&json!({"minLength": -1})).is_err());
        let huge = json!({"enum": vec!["x".repeat(100); 200]});
        assert!(check_input_schema(&huge).unwrap_err().contains("16384"));
    }

    #[test]
    fn an_answer_reads_as_a_line() {
        assert_eq!(answer_text(&json!("staging")), "staging");
        assert_eq!(answer_text(&json!({"b": 1, "a": true})), r#"{"a":true,"b":1}"#);
    }
}
