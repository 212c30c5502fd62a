//! Questions a run puts to a person (approvals of kind `input`): the JSON
//! Schema an answer must satisfy, and the answer as an agent reads it.

use serde_json::Value;

use crate::approval::{canonical_json, check_exact_numbers};
use crate::schema::{compile_kept_schema, compile_schema};

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

/// Problems of an answer listed at most, and the characters of each.
const MAX_PROBLEMS: usize = 5;
const MAX_PROBLEM_CHARS: usize = 300;

/// How deep a question's schema may nest.
const MAX_SCHEMA_DEPTH: usize = 16;

/// Keywords a question's schema may not use: references let a small schema
/// stand for an exponentially large one (a check of any answer could then
/// run for ever); a question's schema is written out whole.
const REFUSED_KEYWORDS: [&str; 7] =
    ["$ref", "$dynamicRef", "$recursiveRef", "$defs", "definitions", "$anchor", "$dynamicAnchor"];

/// The first reference keyword in `value`, or nesting past the limit.
fn refused_part(value: &Value, depth: usize) -> Option<String> {
    if depth > MAX_SCHEMA_DEPTH {
        return Some(format!("The answer schema may nest at most {MAX_SCHEMA_DEPTH} levels deep."));
    }
    match value {
        Value::Object(fields) => fields.iter().find_map(|(key, inner)| {
            if REFUSED_KEYWORDS.contains(&key.as_str()) {
                Some(format!("The answer schema may not use `{key}`: write the schema out whole."))
            } else {
                refused_part(inner, depth + 1)
            }
        }),
        Value::Array(items) => items.iter().find_map(|inner| refused_part(inner, depth + 1)),
        _ => None,
    }
}

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
    if let Some(problem) = refused_part(schema, 0) {
        return Err(problem);
    }
    compile_schema(schema).map(|_| ()).map_err(|error| format!("The answer schema is not a valid JSON Schema: {error}"))
}

/// Whether `answer` satisfies `schema`; else what is wrong and where
/// (`at /env: ...`).
pub fn check_answer(schema: &Value, answer: &Value) -> Result<(), String> {
    if canonical_json(answer).len() > MAX_ANSWER_BYTES {
        return Err(format!("The answer may be at most {MAX_ANSWER_BYTES} bytes as JSON."));
    }
    check_exact_numbers(answer)?;
    // A stored schema was checked when it was asked (perhaps by a release
    // that allowed more).
    let validator = compile_kept_schema(schema).map_err(|_| "The question's schema cannot be read.".to_owned())?;
    let problems: Vec<String> = validator
        .problems(answer, MAX_PROBLEMS)
        .into_iter()
        .map(|problem| match problem.char_indices().nth(MAX_PROBLEM_CHARS) {
            Some((cut, _)) => format!("{}…", &problem[..cut]),
            None => problem,
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
        // References could make a small schema an exponential check.
        let mut defs = serde_json::Map::new();
        for level in 0..40 {
            let next = json!({"$ref": format!("#/$defs/d{}", level + 1)});
            defs.insert(format!("d{level}"), json!({"allOf": [next.clone(), next]}));
        }
        let exploding = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(check_input_schema(&exploding).unwrap_err().contains("may not use"));
        let mut deep = json!({"type": "string"});
        for _ in 0..20 {
            deep = json!({"items": deep});
        }
        assert!(check_input_schema(&deep).unwrap_err().contains("nest"));
    }

    #[test]
    fn an_answer_reads_as_a_line() {
        assert_eq!(answer_text(&json!("staging")), "staging");
        assert_eq!(answer_text(&json!({"b": 1, "a": true})), r#"{"a":true,"b":1}"#);
    }
}
