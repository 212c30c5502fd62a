//! Approval policies: an owner's rules that decide which tool calls need a
//! person. One document per owner, replaced whole; evaluated on the exact
//! arguments of each call; tried on past decisions before it is trusted.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ids::KeyId;
use crate::time::Timestamp;

mod conditions;
mod parse;
#[cfg(test)]
mod tests;

pub use conditions::{Condition, Op, Pattern};
pub use parse::{RuleError, is_rule_id, parse_rules, rules_from_json, rules_json};

/// The most rules a document holds.
pub const MAX_RULES: usize = 200;
/// The largest document, as the JSON of its rules.
pub const MAX_POLICY_BYTES: usize = 64 * 1024;
/// The longest pattern (`matches`) or glob.
const MAX_PATTERN_BYTES: usize = 1024;
/// What one compiled pattern may take: patterns that would blow up are
/// refused, and matching stays linear in the text (the `regex` crate).
const MAX_REGEX_BYTES: usize = 64 * 1024;
/// The most `matches` conditions one document holds: with the size limit,
/// what a document's patterns may take in memory is bounded.
pub const MAX_MATCHES_CONDITIONS: usize = 50;
const MAX_REASON_CHARS: usize = 500;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Allow,
    Deny,
    Ask,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::Ask => "ask",
        }
    }

    pub fn parse(text: &str) -> Option<Effect> {
        [Effect::Allow, Effect::Deny, Effect::Ask].into_iter().find(|effect| effect.as_str() == text)
    }

    /// Among matching rules, deny wins over ask, ask over allow.
    fn rank(self) -> u8 {
        match self {
            Effect::Deny => 2,
            Effect::Ask => 1,
            Effect::Allow => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleMode {
    Enforce,
    /// Never decides; the approval records what the rule would have done.
    LogOnly,
}

impl RuleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleMode::Enforce => "enforce",
            RuleMode::LogOnly => "log_only",
        }
    }

    pub fn parse(text: &str) -> Option<RuleMode> {
        [RuleMode::Enforce, RuleMode::LogOnly].into_iter().find(|mode| mode.as_str() == text)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub id: String,
    pub agent: Pattern,
    pub tool: Pattern,
    pub effect: Effect,
    pub mode: RuleMode,
    pub reason: Option<String>,
    pub when: Vec<Condition>,
}

impl Rule {
    pub fn matches(&self, call: &GatedCall) -> bool {
        self.agent.is_match(call.agent)
            && self.tool.is_match(call.tool)
            && self.when.iter().all(|condition| condition.holds(call.arguments))
    }

    /// The rule as the API shows it, every field present.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "agent": self.agent.as_str(),
            "tool": self.tool.as_str(),
            "effect": self.effect.as_str(),
            "mode": self.mode.as_str(),
            "reason": self.reason,
            "when": self.when.iter().map(|condition| json!({
                "path": condition.path,
                "op": condition.op.name(),
                "value": condition.value,
            })).collect::<Vec<_>>(),
        })
    }
}

/// An owner's policy document.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    /// 0 for an owner who never put one; one more with each put.
    pub version: u64,
    pub rules: Vec<Rule>,
    pub updated_at: Option<Timestamp>,
    pub updated_by: Option<KeyId>,
}

/// A tool call to decide.
#[derive(Clone, Copy, Debug)]
pub struct GatedCall<'a> {
    pub agent: &'a str,
    pub tool: &'a str,
    pub arguments: &'a Value,
    /// The tool's own `requires_approval`: what decides when no rule does.
    pub requires_approval: bool,
    /// The tool's `always_ask`: no rule allows it.
    pub always_ask: bool,
}

/// The rule an approval names: the one that decided (or would have).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyMatch {
    pub rule: String,
    pub effect: Effect,
    pub mode: RuleMode,
    /// The version of the document the rule was in.
    pub version: u64,
}

impl PolicyMatch {
    /// An `enforce` rule of effect `ask`: a person must decide, and no
    /// one's silence may stand in (no veto window).
    pub fn person_must_decide(&self) -> bool {
        self.effect == Effect::Ask && self.mode == RuleMode::Enforce
    }
}

/// What happens to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It runs, with no approval (no rule made one needed, the tool needs
    /// none); `logged` names the first matching `log_only` rule when no
    /// `enforce` rule matched, with what it would have done, so a rule is
    /// seen on calls no one is asked about before it is trusted.
    Run { logged: Option<PolicyMatch> },
    /// A person decides; the approval names `policy` (an `ask` rule, or a
    /// `log_only` rule's verdict), if any.
    Ask { policy: Option<PolicyMatch> },
    /// A rule allowed it where a person would have been asked: it runs, and
    /// an approval, already approved, records the rule.
    Allowed { policy: PolicyMatch },
    /// A rule denied it: it never runs; an approval, already rejected,
    /// records the rule, and the model is told `reason`.
    Denied { policy: PolicyMatch, reason: Option<String> },
}

impl Policy {
    /// The verdict on `call`: among the matching `enforce` rules deny wins
    /// over ask, ask over allow (the first in the document of that effect
    /// decides); with none, the tool's own `requires_approval`. A tool that
    /// always asks is never allowed by a rule: a matching allow acts as ask.
    pub fn evaluate(&self, call: &GatedCall) -> Verdict {
        self.verdict(call, |index| self.rules[index].matches(call))
    }

    /// [`Policy::evaluate`] with whether the rule at each index matches
    /// told by `matches`.
    pub(crate) fn verdict(&self, call: &GatedCall, matches: impl Fn(usize) -> bool) -> Verdict {
        let named = |rule: &Rule, effect: Effect| PolicyMatch {
            rule: rule.id.clone(),
            effect,
            mode: rule.mode,
            version: self.version,
        };
        let person_asked = call.requires_approval || call.always_ask;
        let mut rules = self.rules.iter().enumerate();
        let deciding = rules.clone().filter(|(index, rule)| rule.mode == RuleMode::Enforce && matches(*index)).fold(
            None::<&Rule>,
            |best, (_, rule)| match best {
                Some(best) if best.effect.rank() >= rule.effect.rank() => Some(best),
                _ => Some(rule),
            },
        );
        match deciding {
            Some(rule) => match rule.effect {
                Effect::Deny => Verdict::Denied { policy: named(rule, Effect::Deny), reason: rule.reason.clone() },
                Effect::Ask => Verdict::Ask { policy: Some(named(rule, Effect::Ask)) },
                Effect::Allow if call.always_ask => Verdict::Ask { policy: Some(named(rule, Effect::Ask)) },
                Effect::Allow if person_asked => Verdict::Allowed { policy: named(rule, Effect::Allow) },
                Effect::Allow => Verdict::Run { logged: None },
            },
            None => {
                let logged =
                    rules.find(|(index, rule)| rule.mode == RuleMode::LogOnly && matches(*index)).map(|(_, rule)| {
                        // What it would have done: never allow a tool that always asks.
                        let effect =
                            if call.always_ask && rule.effect == Effect::Allow { Effect::Ask } else { rule.effect };
                        named(rule, effect)
                    });
                if person_asked { Verdict::Ask { policy: logged } } else { Verdict::Run { logged } }
            }
        }
    }

    /// The document as the API shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "version": self.version,
            "rules": self.rules.iter().map(Rule::to_json).collect::<Vec<_>>(),
            "updated_at": self.updated_at.map(Timestamp::to_rfc3339),
            "updated_by": self.updated_by.map(|key| key.to_string()),
        })
    }
}
