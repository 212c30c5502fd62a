//! A rule's conditions on a call's arguments, and the patterns (globs and
//! regular expressions) rules match with.

use std::cmp::Ordering;

use regex::{Regex, RegexBuilder};
use serde_json::{Number, Value};

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
    Lt(Number),
    Le(Number),
    Gt(Number),
    Ge(Number),
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
        let number = || match value {
            Value::Number(number) => Ok(number.clone()),
            _ => Err(("value", format!("must be a number for `{name}`"))),
        };
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
        let number = |bound: &Number, holds: fn(Ordering) -> bool| match found {
            Value::Number(found) => holds(compare(found, bound)),
            _ => false,
        };
        match &self.op {
            Op::Eq(value) => same(found, value),
            Op::Ne(value) => !same(found, value),
            Op::Lt(bound) => number(bound, Ordering::is_lt),
            Op::Le(bound) => number(bound, Ordering::is_le),
            Op::Gt(bound) => number(bound, Ordering::is_gt),
            Op::Ge(bound) => number(bound, Ordering::is_ge),
            Op::In(values) => values.iter().any(|value| same(found, value)),
            Op::NotIn(values) => !values.iter().any(|value| same(found, value)),
            Op::Prefix(prefix) => found.as_str().is_some_and(|text| text.starts_with(prefix.as_str())),
            Op::Matches(pattern) => found.as_str().is_some_and(|text| pattern.is_match(text)),
            Op::Exists(exists) => *exists,
        }
    }
}

/// What a rule is told of a number it cannot compare exactly.
pub(super) const INEXACT: &str = "must not hold a whole number beyond 2^53 that is written as a decimal or an exponent, or beyond 64 bits (it would not read as written); write it as an integer of at most 64 bits, or as a string";

/// Whether `value` holds a number that did not read exactly as written: a
/// whole number read as a double from 2^53 on (past 64 bits, or written as
/// `9007199254740993.0` or `1e20`), which stands for many texts at once.
pub(super) fn holds_inexact_number(value: &Value) -> bool {
    const EXACT_DOUBLES: f64 = 9_007_199_254_740_992.0;
    match value {
        Value::Number(number) => {
            number.as_i64().is_none()
                && number.as_u64().is_none()
                && number.as_f64().is_some_and(|float| float.fract() == 0.0 && float.abs() >= EXACT_DOUBLES)
        }
        Value::Array(items) => items.iter().any(holds_inexact_number),
        Value::Object(fields) => fields.values().any(holds_inexact_number),
        _ => false,
    }
}

/// Two JSON numbers compared exactly: integers as integers (every digit of
/// 64 bits), a fraction against an integer without rounding either.
pub(super) fn compare(left: &Number, right: &Number) -> Ordering {
    let integer = |number: &Number| number.as_i64().map(i128::from).or_else(|| number.as_u64().map(i128::from));
    let float = |number: &Number| number.as_f64().unwrap_or(f64::NAN);
    match (integer(left), integer(right)) {
        (Some(left), Some(right)) => left.cmp(&right),
        (Some(left), None) => integer_against_float(left, float(right)),
        (None, Some(right)) => integer_against_float(right, float(left)).reverse(),
        (None, None) => float(left).partial_cmp(&float(right)).unwrap_or(Ordering::Equal),
    }
}

/// `integer` against `float`, exactly.
fn integer_against_float(integer: i128, float: f64) -> Ordering {
    const BEYOND_I128: f64 = 170_141_183_460_469_231_731_687_303_715_884_105_728.0; // 2^127
    let floor = float.floor();
    if floor >= BEYOND_I128 {
        return Ordering::Less;
    }
    if floor < -BEYOND_I128 {
        return Ordering::Greater;
    }
    // floor <= float < floor + 1
    match integer.cmp(&(floor as i128)) {
        Ordering::Equal if float > floor => Ordering::Less,
        order => order,
    }
}

/// JSON equality where numbers compare by value, exactly (`1` equals
/// `1.0`; `12345678901234567891` does not equal `12345678901234567890`).
fn same(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(left), Value::Number(right)) => compare(left, right) == Ordering::Equal,
        (Value::Array(left), Value::Array(right)) => {
            left.len() == right.len() && left.iter().zip(right).all(|(left, right)| same(left, right))
        }
        (Value::Object(left), Value::Object(right)) => {
            left.len() == right.len()
                && left.iter().all(|(key, value)| right.get(key).is_some_and(|other| same(value, other)))
        }
        _ => left == right,
    }
}
