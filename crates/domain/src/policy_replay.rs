//! Candidate rules tried on the calls people decided.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::approval::{Approval, ApprovalStatus, Resolver};
use crate::ids::{ApprovalId, RunId};
use crate::policy::{Effect, GatedCall, Policy, PolicyMatch, Rule, RuleMode, Verdict};
use crate::time::Timestamp;

/// How a person decided a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HumanDecision {
    Approved,
    Edited,
    Rejected,
}

impl HumanDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            HumanDecision::Approved => "approved",
            HumanDecision::Edited => "edited",
            HumanDecision::Rejected => "rejected",
        }
    }

    pub fn parse(text: &str) -> Option<HumanDecision> {
        [HumanDecision::Approved, HumanDecision::Edited, HumanDecision::Rejected]
            .into_iter()
            .find(|human| human.as_str() == text)
    }
}

/// A tool call a person decided, as the history keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct DecidedCall {
    pub run_id: RunId,
    pub approval_id: ApprovalId,
    pub agent: String,
    pub tool: String,
    /// As proposed.
    pub arguments: Value,
    pub human: HumanDecision,
    pub resolved_at: Timestamp,
}

impl DecidedCall {
    /// `approval` of the run `run_id` (of `agent`) as the history keeps
    /// it: only a tool call, and only once a person decided it.
    pub fn of(run_id: RunId, agent: &str, approval: &Approval) -> Option<DecidedCall> {
        let call = approval.call.as_ref()?;
        if !matches!(approval.resolved_by, Some(Resolver::Key(_))) {
            return None;
        }
        let human = match approval.status {
            ApprovalStatus::Rejected => HumanDecision::Rejected,
            ApprovalStatus::Approved if approval.edited_arguments.is_some() => HumanDecision::Edited,
            ApprovalStatus::Approved => HumanDecision::Approved,
            _ => return None,
        };
        Some(DecidedCall {
            run_id,
            approval_id: approval.id,
            agent: agent.to_owned(),
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            human,
            resolved_at: approval.resolved_at?,
        })
    }
}

/// The most disagreements a replay lists.
pub const MAX_DISAGREEMENTS: usize = 100;

/// What candidate rules would have done with past decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub evaluated: usize,
    pub would_allow: usize,
    pub would_deny: usize,
    pub would_ask: usize,
    /// Newest first, at most [`MAX_DISAGREEMENTS`].
    pub disagreements: Vec<(DecidedCall, PolicyMatch)>,
    /// Per rule id: matched, agreed, disagreed.
    pub rules: BTreeMap<String, RuleTally>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleTally {
    pub matched: usize,
    pub agreed: usize,
    pub disagreed: usize,
}

/// A replay stopped before its end: its `keep_going` said no.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayStopped {
    /// Calls replayed by then.
    pub evaluated: usize,
}

/// Replays `rules` over `history` (newest first), each call as the person
/// saw it (a call put to a person needed one). Only the deciding `enforce`
/// rule agrees or disagrees (a `log_only` rule never decides; an `ask`
/// neither agrees nor disagrees). Each rule is matched once per call;
/// `keep_going` is asked before each call, and a no stops the replay.
pub fn replay(
    rules: Vec<Rule>,
    history: &[DecidedCall],
    mut keep_going: impl FnMut() -> bool,
) -> Result<Replay, ReplayStopped> {
    let policy = Policy { rules, ..Policy::default() };
    let mut replay = Replay { evaluated: history.len(), ..Replay::default() };
    for rule in &policy.rules {
        replay.rules.insert(rule.id.clone(), RuleTally::default());
    }
    let mut matched = vec![false; policy.rules.len()];
    for (index, decided) in history.iter().enumerate() {
        if !keep_going() {
            return Err(ReplayStopped { evaluated: index });
        }
        let call = GatedCall {
            agent: &decided.agent,
            tool: &decided.tool,
            arguments: &decided.arguments,
            requires_approval: true,
            always_ask: false,
        };
        for (rule, matches) in policy.rules.iter().zip(matched.iter_mut()) {
            *matches = rule.matches(&call);
            if *matches && let Some(tally) = replay.rules.get_mut(&rule.id) {
                tally.matched += 1;
            }
        }
        let named = match policy.verdict(&call, |index| matched[index]) {
            Verdict::Allowed { policy } => {
                replay.would_allow += 1;
                Some(policy)
            }
            Verdict::Denied { policy, .. } => {
                replay.would_deny += 1;
                Some(policy)
            }
            Verdict::Ask { policy } => {
                replay.would_ask += 1;
                policy.filter(|policy| policy.mode == RuleMode::Enforce)
            }
            Verdict::Run { .. } => None,
        };
        let Some(named) = named else { continue };
        let agrees = match (named.effect, decided.human) {
            (Effect::Ask, _) => continue,
            (Effect::Allow, HumanDecision::Rejected)
            | (Effect::Deny, HumanDecision::Approved | HumanDecision::Edited) => false,
            _ => true,
        };
        if let Some(tally) = replay.rules.get_mut(&named.rule) {
            if agrees {
                tally.agreed += 1;
            } else {
                tally.disagreed += 1;
            }
        }
        if !agrees && replay.disagreements.len() < MAX_DISAGREEMENTS {
            replay.disagreements.push((decided.clone(), named));
        }
    }
    Ok(replay)
}
