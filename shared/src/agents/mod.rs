//! Agents: what a run executes. The worker drives an agent one step at a
//! time, so it can renew its lease, notice a cancel and save progress in
//! between.

mod echo;
mod script;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::Approval;

pub use echo::EchoAgent;
pub use script::ScriptAgent;

/// What an agent needs to take its next step.
pub struct StepInput<'a> {
    pub input: &'a str,
    /// What the previous step returned; `None` on the first step.
    pub checkpoint: Option<&'a serde_json::Value>,
    /// Every approval of the run so far, oldest first, with their decisions.
    pub approvals: &'a [Approval],
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// More to do; the value is the agent's state to resume from.
    Continue(serde_json::Value),
    /// Wait for a human decision on each action; resume from the checkpoint.
    AwaitApproval {
        actions: Vec<String>,
        checkpoint: serde_json::Value,
    },
    Succeeded(String),
    Failed(String),
}

#[async_trait]
pub trait Agent: Send + Sync + 'static {
    /// Checked when a run is created; the message is shown to the client.
    fn validate_input(&self, input: &str) -> Result<(), String>;

    async fn step(&self, input: StepInput<'_>) -> Step;
}

/// The agents a deployment offers, by name, and the one used by default.
#[derive(Clone)]
pub struct AgentRegistry {
    agents: BTreeMap<String, Arc<dyn Agent>>,
    default: String,
}

impl AgentRegistry {
    /// `echo` and `script`, with `default` used when a run names none.
    pub fn builtin(default: &str) -> Result<Self, String> {
        let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
        agents.insert("echo".into(), Arc::new(EchoAgent));
        agents.insert("script".into(), Arc::new(ScriptAgent));
        if !agents.contains_key(default) {
            return Err(format!("the default agent `{default}` is not one of: {}", names(&agents)));
        }
        Ok(Self { agents, default: default.to_owned() })
    }

    pub fn default_name(&self) -> &str {
        &self.default
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Agent>> {
        self.agents.get(name)
    }

    pub fn names(&self) -> String {
        names(&self.agents)
    }

    pub fn names_list(&self) -> Vec<&str> {
        self.agents.keys().map(String::as_str).collect()
    }
}

fn names(agents: &BTreeMap<String, Arc<dyn Agent>>) -> String {
    agents.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
}
