//! Reading a JSON request body: media type, syntax, and the object's fields.

use bytes::Bytes;
use http::{HeaderMap, header};
use serde_json::{Map, Value};

use super::ApiError;

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Whether a `Content-Type` is `application/json`, parameters allowed.
fn is_json(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(text) = value.to_str() else {
        return false;
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// Parses a body that must be a JSON object. With `optional`, an empty body
/// counts as `{}`.
pub fn json_object(headers: &HeaderMap, body: &Bytes, optional: bool) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return if optional {
            Ok(Map::new())
        } else {
            Err(ApiError::invalid(None, "The request body is empty; send a JSON object."))
        };
    }
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(ApiError::invalid(None, "The request body must be a JSON object.")),
        Err(error) => Err(ApiError::invalid(
            None,
            format!("The request body is not valid JSON (line {}, column {}).", error.line(), error.column()),
        )),
    }
}

/// Refuses the first field not in `known`, naming it.
pub fn reject_unknown_fields(object: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(unknown) => {
            let shown: String = unknown.chars().take(64).collect();
            Err(ApiError::invalid_param(
                shown.clone(),
                format!("Unknown field `{shown}`. Allowed fields: {}.", known.join(", ")),
            ))
        }
        None => Ok(()),
    }
}

/// A string field; `null` counts as absent.
pub fn optional_string(object: &mut Map<String, Value>, field: &'static str) -> Result<Option<String>, ApiError> {
    match object.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ApiError::invalid(field, format!("`{field}` must be a string."))),
    }
}
