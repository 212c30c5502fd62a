//! Reading a JSON request body: media type, syntax, and the object's fields.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, header};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
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
    match serde_json::from_slice::<UniqueNames>(body) {
        Ok(UniqueNames(Value::Object(object))) => Ok(object),
        Ok(_) => Err(ApiError::invalid(None, "The request body must be a JSON object.")),
        Err(error) => Err(ApiError::invalid(
            None,
            match error.classify() {
                serde_json::error::Category::Data => format!("The request body is ambiguous: {error}."),
                _ => format!("The request body is not valid JSON (line {}, column {}).", error.line(), error.column()),
            },
        )),
    }
}

/// A JSON value in which no object names a member twice. RFC 8259 leaves
/// the meaning of a repeated name to each parser (first wins, last wins), so
/// such a body could mean one thing here and another to a proxy or a log
/// reader: it is refused rather than guessed.
struct UniqueNames(Value);

impl<'de> Deserialize<'de> for UniqueNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueNamesVisitor)
    }
}

struct UniqueNamesVisitor;

impl<'de> Visitor<'de> for UniqueNamesVisitor {
    type Value = UniqueNames;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<UniqueNames, E> {
        Ok(UniqueNames(Value::Bool(value)))
    }

    fn visit_i64<E>(self, value: i64) -> Result<UniqueNames, E> {
        Ok(UniqueNames(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<UniqueNames, E> {
        Ok(UniqueNames(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<UniqueNames, E> {
        Ok(UniqueNames(value.into()))
    }

    fn visit_str<E>(self, value: &str) -> Result<UniqueNames, E> {
        Ok(UniqueNames(Value::String(value.to_owned())))
    }

    fn visit_string<E>(self, value: String) -> Result<UniqueNames, E> {
        Ok(UniqueNames(Value::String(value)))
    }

    fn visit_unit<E>(self) -> Result<UniqueNames, E> {
        Ok(UniqueNames(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueNames, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(UniqueNames(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(UniqueNames(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueNames, A::Error> {
        let mut object = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let UniqueNames(value) = map.next_value()?;
            if object.contains_key(&name) {
                let shown: String = name.chars().take(64).collect();
                return Err(de::Error::custom(format_args!("the name `{shown}` appears twice in one object")));
            }
            object.insert(name, value);
        }
        Ok(UniqueNames(Value::Object(object)))
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

/// A JSON number that is a whole number, however written (`60` or
/// `60.0`); `None` for anything else. Callers check their own range.
pub fn whole_number(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_f64().filter(|n| n.fract() == 0.0 && *n >= 0.0).map(|n| n as u64))
}

/// A string field; `null` counts as absent.
pub fn optional_string(object: &mut Map<String, Value>, field: &'static str) -> Result<Option<String>, ApiError> {
    match object.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ApiError::invalid(field, format!("`{field}` must be a string."))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Map<String, Value>, String> {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        json_object(&headers, &Bytes::copy_from_slice(body.as_bytes()), false).map_err(|error| error.to_string())
    }

    #[test]
    fn a_name_repeated_in_any_object_is_refused_and_named() {
        let cases = [
            (r#"{"input": "x", "input": "y"}"#, "input"),
            (r#"{"metadata": {"k": "a", "j": [{"k": 1, "k": 1}]}}"#, "k"),
        ];
        for (body, name) in cases {
            let message = parse(body).expect_err(body);
            assert!(message.contains(&format!("the name `{name}` appears twice")), "{message}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        let body = format!(r#"{{"input": {}{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&body).expect_err("too deep").starts_with("The request body is not valid JSON"));
    }

    #[test]
    fn distinct_names_parse_as_serde_json_does() {
        let body = r#"{"a": {"k": 1, "K": -2, "k2": 1.5e3}, "b": [{"k": null}, {"k": true}], "c": "\u00e9", "d": 18446744073709551615}"#;
        let expected = serde_json::from_str::<Value>(body).unwrap();
        assert_eq!(Value::Object(parse(body).unwrap()), expected);
    }
}
