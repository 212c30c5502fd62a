//! A rule's conditions on a call's arguments, and the patterns (globs and
//! regular expressions) rules match with.

use regex::{Regex, RegexBuilder};
use serde_json::Value;

use super::{MAX_PATTERN_BYTES, MAX_REGEX_BYTES};

/// A pattern as written and as compiled.
#[derive(Clone, Debug)]
pub struct Pattern {
    text: String,
    regex: Regex,
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Pattern {
    /// A glob: `*` any run of characters, `?` one, anything else itself.
    pub(super) fn glob(text: &str) -> Result<Pattern, String> {
        if text.is_empty() || text.len() > MAX_PATTERN_BYTES {
            return Err(format!("must be a glob pattern of 1 to {MAX_PATTERN_BYTES} bytes"));
        }
        let mut expression = String::with_capacity(text.len() + 8);
        for character in text.chars() {
            match character {
                '*' => expression.push_str(".*"),
                '?' => expression.push('.'),
                other => expression.push_str(&regex::escape(other.encode_utf8(&mut [0; 4]))),
            }
        }
        Pattern::whole(text, &expression)
    }

    /// A regular expression that must match the whole string. It is
    /// checked on its own first, so that no text can close the group that
    /// anchors it (`a)|(b`).
    pub(super) fn regex(text: &str) -> Result<Pattern, String> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(format!("must be a regular expression of at most {MAX_PATTERN_BYTES} bytes"));
        }
        compile(text)?;
        Pattern::whole(text, text)
    }

    fn whole(text: &str, expression: &str) -> Result<Pattern, String> {
        Ok(Pattern { text: text.to_owned(), regex: compile(&format!(r"\A(?:{expression})\z"))? })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }
}

fn compile(expression: &str) -> Result<Regex, String> {
    RegexBuilder::new(expression).size_limit(MAX_REGEX_BYTES).dfa_size_limit(MAX_REGEX_BYTES).build().map_err(|error| {
        match error {
            regex::Error::CompiledTooBig(_) => "is too large a regular expression once compiled".to_owned(),
            _ => "is not a valid regular expression".to_owned(),
        }
    })
}

/// One condition on the call's arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    /// A JSON Pointer (RFC 6901) into the arguments.
    pub path: String,
    pub op: Op,
    /// The value as written (numbers keep their form).
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Eq(Value),
    Ne(Value),
    Lt(f64),
    Le(f64),
    Gt(f64),
    Ge(f64),
    In(Vec<Value>),
    NotIn(Vec<Value>),
    Prefix(String),
    Matches(Pattern),
    Exists(bool),
}

pub(super) const OPS: [&str; 11] = ["==", "!=", "<", "<=", ">", ">=", "in", "not_in", "prefix", "matches", "exists"];

impl Op {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Eq(_) => "==",
            Op::Ne(_) => "!=",
            Op::Lt(_) => "<",
            Op::Le(_) => "<=",
            Op::Gt(_) => ">",
            Op::Ge(_) => ">=",
            Op::In(_) => "in",
            Op::NotIn(_) => "not_in",
            Op::Prefix(_) => "prefix",
            Op::Matches(_) => "matches",
            Op::Exists(_) => "exists",
        }
    }

    pub(super) fn parse(name: &str, value: &Value) -> Result<Op, (&'static str, String)> {
        let number = || value.as_f64().ok_or(("value", format!("must be a number for `{name}`")));
        let array = || value.as_array().cloned().ok_or(("value", format!("must be an array for `{name}`")));
        let string = || value.as_str().ok_or(("value", format!("must be a string for `{name}`")));
        Ok(match name {
            "==" => Op::Eq(value.clone()),
            "!=" => Op::Ne(value.clone()),
            "<" => Op::Lt(number()?),
            "<=" => Op::Le(number()?),
            ">" => Op::Gt(number()?),
            ">=" => Op::Ge(number()?),
            "in" => Op::In(array()?),
            "not_in" => Op::NotIn(array()?),
            "prefix" => Op::Prefix(string()?.to_owned()),
            "matches" => Op::Matches(Pattern::regex(string()?).map_err(|problem| ("value", problem))?),
            "exists" => Op::Exists(value.as_bool().ok_or(("value", "must be true or false for `exists`".to_owned()))?),
            _ => return Err(("op", format!("must be one of {}", OPS.join(", ")))),
        })
    }
}

impl Condition {
    /// Whether the condition holds for these arguments. A path that does
    /// not exist makes every op false but `exists: false`, `!=` and
    /// `not_in`.
    pub fn holds(&self, arguments: &Value) -> bool {
        let Some(found) = arguments.pointer(&self.path) else {
            return matches!(self.op, Op::Exists(false) | Op::Ne(_) | Op::NotIn(_));
        };
        let number = |bound: f64, compare: fn(f64, f64) -> bool| found.as_f64().is_some_and(|n| compare(n, bound));
        match &self.op {
            Op::Eq(value) => same(found, value),
            Op::Ne(value) => !same(found, value),
            Op::Lt(bound) => number(*bound, |n, b| n < b),
            Op::Le(bound) => number(*bound, |n, b| n <= b),
            Op::Gt(bound) => number(*bound, |n, b| n > b),
            Op::Ge(bound) => number(*bound, |n, b| n >= b),
            Op::In(values) => values.iter().any(|value| same(found, value)),
            Op::NotIn(values) => !values.iter().any(|value| same(found, value)),
            Op::Prefix(prefix) => found.as_str().is_some_and(|text| text.starts_with(prefix.as_str())),
            Op::Matches(pattern) => found.as_str().is_some_and(|text| pattern.is_match(text)),
            Op::Exists(exists) => *exists,
        }
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
fn same(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => match (left.as_f64(), right.as_f64()) {
            (Some(left), Some(right)) => left == right,
            _ => left == right,
        },
        _ => left == right,
    }
}
