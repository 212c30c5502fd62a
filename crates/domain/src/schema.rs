//! JSON Schemas the service compiles and checks values against: a tool's
//! `parameters`, an MCP tool's `inputSchema`, a question's answer schema.
//! Whoever wrote the schema (an agent's author, an MCP server, a model) may
//! be hostile, so its cost is bounded: patterns run on a linear-time engine
//! with a size limit, a schema holds a bounded number of them, and a schema
//! is compiled once per process however often it is checked against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use jsonschema::{PatternOptions, Validator};
use serde_json::Value;

use super::canonical_json;

/// The most patterns (`pattern` keywords and `patternProperties` keys) a
/// schema may hold.
pub const MAX_SCHEMA_PATTERNS: usize = 32;

/// What one compiled pattern may take, and its matching cache (as for a
/// policy's `matches`): a pattern that compiles large (`(.{100}){100}`) is
/// refused rather than held.
const MAX_PATTERN_PROGRAM_BYTES: usize = 64 * 1024;
const MAX_PATTERN_CACHE_BYTES: usize = 64 * 1024;

/// Compiled schemas kept per process; past it the cache starts again. With
/// the limits above, what they hold is bounded (64 × 32 × 128 KiB at worst).
const MAX_CACHED_SCHEMAS: usize = 64;

static COMPILED: Mutex<Option<HashMap<String, CompiledSchema>>> = Mutex::new(None);

/// A compiled schema, shared by whoever compiled the same one.
#[derive(Clone)]
pub struct CompiledSchema(Arc<Validator>);

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CompiledSchema")
    }
}

/// How many patterns `value` holds, counted as a schema would use them.
fn patterns_in(value: &Value) -> usize {
    match value {
        Value::Object(fields) => fields
            .iter()
            .map(|(key, inner)| {
                let own = match (key.as_str(), inner) {
                    ("pattern", Value::String(_)) => 1,
                    ("patternProperties", Value::Object(patterns)) => patterns.len(),
                    _ => 0,
                };
                own + patterns_in(inner)
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns_in).sum(),
        _ => 0,
    }
}

/// `schema` compiled, or what is wrong with it. The same schema (by its
/// canonical JSON) is compiled once and shared.
pub fn compile_schema(schema: &Value) -> Result<CompiledSchema, String> {
    let key = canonical_json(schema);
    if let Some(found) = COMPILED.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|map| map.get(&key))
    {
        return Ok(found.clone());
    }
    let patterns = patterns_in(schema);
    if patterns > MAX_SCHEMA_PATTERNS {
        return Err(format!("it holds {patterns} patterns; at most {MAX_SCHEMA_PATTERNS} are allowed"));
    }
    let validator = jsonschema::options()
        .with_pattern_options(
            PatternOptions::regex().size_limit(MAX_PATTERN_PROGRAM_BYTES).dfa_size_limit(MAX_PATTERN_CACHE_BYTES),
        )
        .build(schema)
        .map(|validator| CompiledSchema(Arc::new(validator)))
        .map_err(|error| {
            let text = error.to_string();
            if text.contains("regular expression") || text.contains("regex") {
                format!(
                    "{text} (patterns are regular expressions without look-around or back-references, at most {MAX_PATTERN_PROGRAM_BYTES} bytes once compiled)"
                )
            } else {
                text
            }
        })?;
    let mut compiled = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    let map = compiled.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_CACHED_SCHEMAS {
        map.clear();
    }
    map.insert(key, validator.clone());
    Ok(validator)
}

impl CompiledSchema {
    pub fn is_valid(&self, value: &Value) -> bool {
        self.0.is_valid(value)
    }

    /// What is wrong with `value`: at most `most` problems, each
    /// `at /path: ...` when not at the root; empty when it matches.
    pub fn problems(&self, value: &Value, most: usize) -> Vec<String> {
        self.0
            .iter_errors(value)
            .take(most)
            .map(|error| {
                let at = error.instance_path().to_string();
                if at.is_empty() { error.to_string() } else { format!("at {at}: {error}") }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_run_in_linear_time_and_compile_small() {
        // Back-references need backtracking: refused.
        let backtracking = json!({"type": "string", "not": {"pattern": r"^(a|a?)+\1b$"}});
        assert!(compile_schema(&backtracking).is_err());
        // A pattern fine for a backtracking engine but slow for it runs here
        // in time linear in the text.
        let nested = compile_schema(&json!({"type": "string", "pattern": "^(a|a?)+b$"})).unwrap();
        let long = "a".repeat(8_000);
        assert!(!nested.is_valid(&json!(long)));
        // One that compiles large is refused, not held.
        let large = compile_schema(&json!({"type": "string", "pattern": "(.{100}){100}N"})).unwrap_err();
        assert!(large.contains("at most 65536 bytes once compiled"), "{large}");
        // Look-around has no linear-time match.
        assert!(compile_schema(&json!({"pattern": "^(?=.*[A-Z]).+$"})).is_err());
        // What a schema usually holds still works.
        let usual = compile_schema(&json!({"type": "string", "pattern": "^[a-z0-9-]{1,64}$"})).unwrap();
        assert!(usual.is_valid(&json!("feature-x")) && !usual.is_valid(&json!("Feature X")));
    }

    #[test]
    fn a_schema_holds_a_bounded_number_of_patterns() {
        let properties: serde_json::Map<String, Value> = (0..=MAX_SCHEMA_PATTERNS)
            .map(|index| (format!("p{index}"), json!({"type": "string", "pattern": format!("^x{index}$")})))
            .collect();
        let problem = compile_schema(&json!({"type": "object", "properties": properties})).unwrap_err();
        assert!(problem.contains("33 patterns; at most 32"), "{problem}");
        let keyed: serde_json::Map<String, Value> =
            (0..40).map(|index| (format!("^k{index}$"), json!({"type": "string"}))).collect();
        assert!(compile_schema(&json!({"patternProperties": keyed})).is_err());
        // A property that is named `pattern` is no pattern.
        assert_eq!(patterns_in(&json!({"properties": {"pattern": {"type": "string"}}})), 0);
    }

    #[test]
    fn a_schema_is_compiled_once() {
        let schema = json!({"type": "string", "pattern": "^once-[0-9]+$"});
        let first = compile_schema(&schema).unwrap();
        let again = compile_schema(&json!({"pattern": "^once-[0-9]+$", "type": "string"})).unwrap();
        assert!(Arc::ptr_eq(&first.0, &again.0), "the same schema, keys in another order, is the same validator");
    }
}
