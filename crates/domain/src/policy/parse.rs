//! A policy document as sent: every rule checked, the first fault named by
//! the rule's index and the field.

use std::collections::HashSet;

use serde_json::Value;

use super::conditions::{Condition, INEXACT, OPS, Op, Pattern, holds_inexact_number};
use super::{Effect, MAX_MATCHES_CONDITIONS, MAX_POLICY_BYTES, MAX_REASON_CHARS, MAX_RULES, Rule, RuleMode};

/// Why a document was refused: the rule (by index) and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{param}` {message}")]
pub struct RuleError {
    pub index: Option<usize>,
    /// Where, e.g. `rules[1].when[0].op`.
    pub param: String,
    pub message: String,
}

fn refuse(index: Option<usize>, param: impl Into<String>, message: impl Into<String>) -> RuleError {
    RuleError { index, param: param.into(), message: message.into() }
}

/// The rules of a document as sent (`{"rules": [...]}`), checked whole.
pub fn parse_rules(body: &Value) -> Result<Vec<Rule>, RuleError> {
    let Some(object) = body.as_object() else {
        return Err(refuse(None, "body", "must be a JSON object with `rules`"));
    };
    if let Some(unknown) = object.keys().find(|key| *key != "rules") {
        return Err(refuse(None, unknown.as_str(), "is not a field of a policy document"));
    }
    let rules = rules_of(object.get("rules"))?;
    if serde_json::to_string(rules).map_or(0, |text| text.len()) > MAX_POLICY_BYTES {
        return Err(refuse(None, "rules", format!("must be at most {MAX_POLICY_BYTES} bytes as JSON")));
    }
    let parsed = parse_list(rules)?;
    // Refused as sent, not as stored: a document stored before this check
    // still reads (its numbers compare as they read).
    for (index, rule) in parsed.iter().enumerate() {
        if let Some(at) = rule.when.iter().position(|condition| holds_inexact_number(&condition.value)) {
            return Err(refuse(Some(index), format!("rules[{index}].when[{at}].value"), INEXACT));
        }
    }
    Ok(parsed)
}

fn parse_list(rules: &[Value]) -> Result<Vec<Rule>, RuleError> {
    let mut ids = HashSet::new();
    let mut patterns = 0;
    rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            let rule = parse_rule(index, rule)?;
            if !ids.insert(rule.id.clone()) {
                return Err(refuse(
                    Some(index),
                    format!("rules[{index}].id"),
                    format!("`{}` is used by an earlier rule", rule.id),
                ));
            }
            patterns += rule.when.iter().filter(|condition| matches!(condition.op, Op::Matches(_))).count();
            if patterns > MAX_MATCHES_CONDITIONS {
                return Err(refuse(
                    Some(index),
                    format!("rules[{index}].when"),
                    format!("brings the document past {MAX_MATCHES_CONDITIONS} `matches` conditions"),
                ));
            }
            Ok(rule)
        })
        .collect()
}

fn rules_of(rules: Option<&Value>) -> Result<&Vec<Value>, RuleError> {
    let rules = rules
        .ok_or_else(|| refuse(None, "rules", "is required: an array of rules (empty for none)"))?
        .as_array()
        .ok_or_else(|| refuse(None, "rules", "must be an array of rules"))?;
    if rules.len() > MAX_RULES {
        return Err(refuse(None, "rules", format!("must hold at most {MAX_RULES} rules")));
    }
    Ok(rules)
}

const RULE_FIELDS: [&str; 7] = ["id", "agent", "tool", "effect", "mode", "reason", "when"];
const CONDITION_FIELDS: [&str; 3] = ["path", "op", "value"];

fn parse_rule(index: usize, rule: &Value) -> Result<Rule, RuleError> {
    let at = |field: &str| format!("rules[{index}].{field}");
    let refused = |field: &str, message: String| refuse(Some(index), at(field), message);
    let Some(rule) = rule.as_object() else {
        return Err(refuse(Some(index), format!("rules[{index}]"), "must be an object"));
    };
    if let Some(unknown) = rule.keys().find(|key| !RULE_FIELDS.contains(&key.as_str())) {
        return Err(refused(unknown, "is not a field of a rule".into()));
    }
    // Only `reason` may be null; a field left out takes its default.
    let text = |field: &str| -> Result<Option<&str>, RuleError> {
        match rule.get(field) {
            None => Ok(None),
            Some(Value::Null) if field == "reason" => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(refused(field, "must be a string".into())),
        }
    };
    let id = text("id")?.ok_or_else(|| refused("id", "is required".into()))?;
    if !is_rule_id(id) {
        return Err(refused(
            "id",
            "must be 1 to 63 lower-case letters, digits, `_` or `-`, starting with a letter or digit".into(),
        ));
    }
    let glob = |field: &str| Pattern::glob(text(field)?.unwrap_or("*")).map_err(|problem| refused(field, problem));
    let effect = text("effect")?.ok_or_else(|| refused("effect", "is required: allow, deny or ask".into()))?;
    let effect = Effect::parse(effect).ok_or_else(|| refused("effect", "must be allow, deny or ask".into()))?;
    let mode = match text("mode")? {
        None => RuleMode::Enforce,
        Some(mode) => RuleMode::parse(mode).ok_or_else(|| refused("mode", "must be enforce or log_only".into()))?,
    };
    let reason = text("reason")?.map(str::to_owned);
    if reason.as_ref().is_some_and(|reason| reason.chars().count() > MAX_REASON_CHARS) {
        return Err(refused("reason", format!("must be at most {MAX_REASON_CHARS} characters")));
    }
    let when = match rule.get("when") {
        None => Vec::new(),
        Some(Value::Array(conditions)) => conditions
            .iter()
            .enumerate()
            .map(|(number, condition)| parse_condition(index, number, condition))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(refused("when", "must be an array of conditions".into())),
    };
    Ok(Rule { id: id.to_owned(), agent: glob("agent")?, tool: glob("tool")?, effect, mode, reason, when })
}

fn parse_condition(index: usize, number: usize, condition: &Value) -> Result<Condition, RuleError> {
    let at = |field: &str| format!("rules[{index}].when[{number}].{field}");
    let refused = |field: &str, message: String| refuse(Some(index), at(field), message);
    let Some(condition) = condition.as_object() else {
        return Err(refuse(Some(index), format!("rules[{index}].when[{number}]"), "must be an object"));
    };
    if let Some(unknown) = condition.keys().find(|key| !CONDITION_FIELDS.contains(&key.as_str())) {
        return Err(refused(unknown, "is not a field of a condition".into()));
    }
    let path = match condition.get("path") {
        Some(Value::String(path)) if path.is_empty() || path.starts_with('/') => path.clone(),
        Some(Value::String(_)) => {
            return Err(refused("path", "must be a JSON Pointer: empty, or starting with `/`".into()));
        }
        _ => return Err(refused("path", "is required: a JSON Pointer into the arguments".into())),
    };
    let op = condition
        .get("op")
        .and_then(Value::as_str)
        .ok_or_else(|| refused("op", format!("is required: one of {}", OPS.join(", "))))?;
    // An unknown op is named as such, whatever else the condition lacks.
    if !OPS.contains(&op) {
        return Err(refused("op", format!("must be one of {}", OPS.join(", "))));
    }
    let value = condition.get("value").ok_or_else(|| refused("value", "is required".into()))?;
    let op = Op::parse(op, value).map_err(|(field, problem)| refused(field, problem))?;
    Ok(Condition { path, op, value: value.clone() })
}

/// `^[a-z0-9][a-z0-9_-]{0,62}$`, as the contract has it.
pub fn is_rule_id(id: &str) -> bool {
    let mut characters = id.chars();
    characters.next().is_some_and(|first| first.is_ascii_lowercase() || first.is_ascii_digit())
        && id.len() <= 63
        && characters.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The rules' JSON as stored: the array the API shows.
pub fn rules_json(rules: &[Rule]) -> Value {
    Value::Array(rules.iter().map(Rule::to_json).collect())
}

/// Rules read back from [`rules_json`] (which fills in every default, so
/// may be longer than the document as sent: no size limit here).
pub fn rules_from_json(rules: &Value) -> Result<Vec<Rule>, RuleError> {
    parse_list(rules.as_array().ok_or_else(|| refuse(None, "rules", "must be an array of rules"))?)
}
