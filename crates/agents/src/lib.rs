//! Agents: what a run executes. The worker drives an agent one step at a
//! time, so it can renew its lease, notice a cancel and save progress in
//! between.

mod echo;
pub mod llm;
pub mod public_network;
mod script;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use agent_runs_domain::{Approval, ApprovalRequest, Budget, EventData, Policy, RunId, Usage};
use agent_runs_ports::lock;
use agent_runs_ports::store::{AgentStore, StoreError};

pub use echo::EchoAgent;
pub use script::ScriptAgent;

/// What an agent needs to take its next step.
pub struct StepInput<'a> {
    pub run_id: RunId,
    pub input: &'a str,
    /// What the previous step returned; `None` on the first step.
    pub checkpoint: Option<&'a serde_json::Value>,
    /// On the first step of a run that continues another: the state that
    /// run's agent ended with (a defined agent's transcript).
    pub carried: Option<&'a serde_json::Value>,
    /// Every approval of the run so far, oldest first, with their decisions.
    pub approvals: &'a [Approval],
    /// The run's token usage and tool calls so far; an agent adds what its
    /// model reports and the calls it makes.
    pub usage: &'a mut Option<Usage>,
    /// What the client limited the run to (an agent's own limits apply too).
    pub budget: Budget,
    /// What the step did that clients may follow (`output.appended`,
    /// `model.responded`, `tool.completed`): written with the state the
    /// step returns, so work done again is never reported twice.
    pub events: &'a mut Vec<EventData>,
    /// Set by the agent when the step starts what must not be cut off.
    pub must_finish: &'a MustFinish,
    /// The owner's approval policy, as read before this step (an empty one
    /// for a step that judges no calls).
    pub policy: &'a Policy,
}

/// Set by a step that has started something whose outcome must be
/// recorded (an HTTP tool call): a stopping worker then lets the step end
/// instead of giving it up. A cancel still gives it up.
#[derive(Debug, Default)]
pub struct MustFinish(std::sync::atomic::AtomicBool);

impl MustFinish {
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// More to do; the value is the agent's state to resume from.
    Continue(serde_json::Value),
    /// More to do, and what was done must not be done again: the worker
    /// saves this state before the next step.
    Checkpoint(serde_json::Value),
    /// Wait for a human decision on each request; resume from the checkpoint.
    AwaitApproval {
        requests: Vec<ApprovalRequest>,
        checkpoint: serde_json::Value,
    },
    /// Done; `transcript`, when the agent has one, is the state a run
    /// continuing this one carries on from.
    Succeeded {
        output: String,
        transcript: Option<serde_json::Value>,
    },
    Failed(String),
}

impl Step {
    /// Done with `output`, and nothing for a continuation to carry on from.
    pub fn succeeded(output: impl Into<String>) -> Step {
        Step::Succeeded { output: output.into(), transcript: None }
    }
}

#[async_trait]
pub trait Agent: Send + Sync + 'static {
    /// Checked when a run is created; the message is shown to the client.
    fn validate_input(&self, input: &str) -> Result<(), String>;

    /// What a built-in agent does, for whoever asks (`GET /v1/agents/{agent}`).
    fn description(&self) -> Option<&'static str> {
        None
    }

    async fn step(&self, input: StepInput<'_>) -> Step;

    /// Whether the step from `checkpoint` puts tool calls to the owner's
    /// approval policy: the worker reads the policy in force only for such
    /// a step (a model's turn), never once per call.
    fn judges_calls(&self, _checkpoint: Option<&serde_json::Value>) -> bool {
        false
    }

    /// Whether a run's first step ends it at once, calling nothing outside
    /// the process. The worker then writes the run's claim with its end:
    /// one write instead of two, and an attempt run twice (a message
    /// delivered twice) only finds its end's write refused.
    fn ends_at_once(&self) -> bool {
        false
    }
}

/// The agents a deployment offers, by name, and the one used by default:
/// the built-in ones and, when a store of definitions is attached, the
/// operator's.
#[derive(Clone)]
pub struct AgentRegistry {
    builtin: BTreeMap<String, Arc<dyn Agent>>,
    default: String,
    defined: Option<Arc<DefinedAgents>>,
}

/// What `GET /v1/agents/{agent}` shows of an agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AgentAbout {
    pub name: String,
    pub description: Option<String>,
    /// The key that created a run may not decide its approvals.
    pub separate_approver: bool,
}

/// Agents defined in the store: known by name (to accept runs) and, where
/// runs execute, built; both kept for a while.
struct DefinedAgents {
    store: Arc<dyn AgentStore>,
    /// Only where runs execute (the worker): the API never builds an agent,
    /// so its functions link no provider or tool code.
    runtime: Option<Arc<llm::LlmRuntime>>,
    cache_for: Duration,
    known: Mutex<HashMap<String, Instant>>,
    built: Mutex<HashMap<String, BuiltAgent>>,
}

/// A defined agent as built, and when.
type BuiltAgent = (Instant, Arc<dyn Agent>);

impl AgentRegistry {
    /// `echo` and `script`, with `default` used when a run names none.
    pub fn builtin(default: &str) -> Result<Self, String> {
        let mut agents: BTreeMap<String, Arc<dyn Agent>> = BTreeMap::new();
        agents.insert("echo".into(), Arc::new(EchoAgent));
        agents.insert("script".into(), Arc::new(ScriptAgent));
        if !agents.contains_key(default) {
            return Err(format!("the default agent `{default}` is not one of: {}", names(&agents)));
        }
        Ok(Self { builtin: agents, default: default.to_owned(), defined: None })
    }

    /// With another agent by this name (tests: an agent whose steps they
    /// choose).
    pub fn with_agent(mut self, name: &str, agent: Arc<dyn Agent>) -> Self {
        self.builtin.insert(name.to_owned(), agent);
        self
    }

    /// The built-in agents and those defined in `store`; `default` may name
    /// either. A definition changed in the store is used within `cache_for`.
    /// Defined agents can be executed only with a `runtime`.
    pub fn with_defined(
        default: &str,
        store: Arc<dyn AgentStore>,
        runtime: Option<Arc<llm::LlmRuntime>>,
        cache_for: Duration,
    ) -> Self {
        let mut registry = Self::builtin("echo").unwrap_or_else(|_| unreachable!("echo is built in"));
        registry.default = default.to_owned();
        let defined = DefinedAgents { store, runtime, cache_for, known: Mutex::default(), built: Mutex::default() };
        registry.defined = Some(Arc::new(defined));
        registry
    }

    pub fn default_name(&self) -> &str {
        &self.default
    }

    /// Whether `name` names an agent that accepts `input`, without building
    /// it: `None` when there is no such agent, `Some(Err(why))` when it
    /// refuses the input.
    pub async fn check(&self, name: &str, input: &str) -> Result<Option<Result<(), String>>, StoreError> {
        if let Some(agent) = self.builtin.get(name) {
            return Ok(Some(agent.validate_input(input)));
        }
        match &self.defined {
            // A defined agent takes any text: its model reads it.
            Some(defined) if defined.exists(name).await? => Ok(Some(Ok(()))),
            _ => Ok(None),
        }
    }

    /// What a client may know of the agent of that name; `None` when there
    /// is no such agent.
    pub async fn about(&self, name: &str) -> Result<Option<AgentAbout>, StoreError> {
        if let Some(agent) = self.builtin.get(name) {
            let description = agent.description().map(str::to_owned);
            return Ok(Some(AgentAbout { name: name.to_owned(), description, separate_approver: false }));
        }
        let Some(defined) = &self.defined else { return Ok(None) };
        Ok(defined.store.get_agent(name).await?.map(|agent| AgentAbout {
            name: agent.name,
            description: agent.description,
            separate_approver: agent.separate_approver,
        }))
    }

    /// Whether the agent of that name wants a run's approvals decided by
    /// another key than the one that created the run.
    pub async fn requires_separate_approver(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.about(name).await?.is_some_and(|agent| agent.separate_approver))
    }

    /// Whether `arguments` a person edited fit the JSON Schema of the
    /// agent's tool as it is defined now; `Err(why)` says what is wrong.
    pub async fn check_tool_arguments(
        &self,
        agent: &str,
        tool: &str,
        arguments: &serde_json::Value,
    ) -> Result<Result<(), String>, StoreError> {
        let definition = match &self.defined {
            Some(defined) if !self.builtin.contains_key(agent) => defined.store.get_agent(agent).await?,
            _ => None,
        };
        let gone =
            || Ok(Err(format!("The agent `{agent}` no longer has the tool `{tool}`; its call cannot be edited.")));
        let Some(definition) = definition else { return gone() };
        // An MCP tool's schema is the server's: the edit is checked against
        // it when the call is made (this API does not reach the server).
        if let Some((server, name)) = definition.mcp_tool(tool) {
            return match arguments {
                _ if !server.offers(name) => gone(),
                serde_json::Value::Object(_) => Ok(Ok(())),
                _ => Ok(Err("The arguments must be a JSON object.".into())),
            };
        }
        let Some(tool) = definition.tools.into_iter().find(|t| t.name == tool) else { return gone() };
        let tool = llm::Tool::new(tool).map_err(|error| {
            StoreError::Defect(format!("stored agent `{agent}` has an invalid tool schema: {error}"))
        })?;
        Ok(tool.check_arguments(&arguments.to_string()).map(|_| ()))
    }

    /// The budget every run of the agent of that name has at most (none
    /// for the built-in agents, which spend nothing).
    pub async fn budget(&self, name: &str) -> Result<Budget, StoreError> {
        match &self.defined {
            Some(defined) if !self.builtin.contains_key(name) => {
                Ok(defined.store.get_agent(name).await?.map(|agent| agent.budget()).unwrap_or_default())
            }
            _ => Ok(Budget::default()),
        }
    }

    /// The agent of that name, ready to execute; `None` when there is none.
    pub async fn resolve(&self, name: &str) -> Result<Option<Arc<dyn Agent>>, StoreError> {
        if let Some(agent) = self.builtin.get(name) {
            return Ok(Some(agent.clone()));
        }
        match &self.defined {
            Some(defined) => defined.resolve(name).await,
            None => Ok(None),
        }
    }

    /// Whether `name` is a built-in agent whose runs end at their first
    /// step (see [`Agent::ends_at_once`]).
    pub fn ends_at_once(&self, name: &str) -> bool {
        self.builtin.get(name).is_some_and(|agent| agent.ends_at_once())
    }

    /// The built-in agents' names.
    pub fn names(&self) -> String {
        names(&self.builtin)
    }

    pub fn names_list(&self) -> Vec<&str> {
        self.builtin.keys().map(String::as_str).collect()
    }
}

impl DefinedAgents {
    async fn exists(&self, name: &str) -> Result<bool, StoreError> {
        if lock(&self.known).get(name).is_some_and(|seen| seen.elapsed() < self.cache_for) {
            return Ok(true);
        }
        let found = self.store.get_agent(name).await?.is_some();
        if found {
            lock(&self.known).insert(name.to_owned(), Instant::now());
        }
        Ok(found)
    }

    async fn resolve(&self, name: &str) -> Result<Option<Arc<dyn Agent>>, StoreError> {
        let cached = lock(&self.built).get(name).cloned();
        if let Some((built, agent)) = cached
            && built.elapsed() < self.cache_for
        {
            return Ok(Some(agent));
        }
        let Some(definition) = self.store.get_agent(name).await? else {
            return Ok(None);
        };
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| StoreError::Defect("this process does not execute defined agents".into()))?;
        let agent: Arc<dyn Agent> = Arc::new(
            runtime
                .agent(definition)
                .await
                .map_err(|error| StoreError::Defect(format!("stored agent `{name}` is invalid: {error}")))?,
        );
        lock(&self.built).insert(name.to_owned(), (Instant::now(), agent.clone()));
        Ok(Some(agent))
    }
}

fn names(agents: &BTreeMap<String, Arc<dyn Agent>>) -> String {
    agents.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
}
