//! The composition root: the API, the workers and the sweeper, built the
//! same way for every way of running. Only the [`Adapters`] differ:
//! DynamoDB and SQS on AWS (`agent_runs_lambda::AwsServices`), SQLite and the in-process
//! queue in `agent-runs serve`, fault-injecting wrappers in tests.

use agent_runs_ports::receipts::{PublishedKeys, Receipts};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_config::SdkConfig;

use crate::api::{Api, ApiParts};
use crate::auth::Authenticator;
use crate::config::Config;
use crate::metrics::MetricsSink;
use crate::webhooks::{Deliverer, DeliveryPolicy, WebhookEngine};
use crate::worker::{Sweeper, Worker};
use agent_runs_agents::AgentRegistry;
use agent_runs_agents::llm::LlmRuntime;
use agent_runs_domain::{Clock, SystemClock};
use agent_runs_ports::queue::RunQueue;
use agent_runs_ports::store::{AgentStore, KeyStore, PolicyStore, Store, WebhookStore};

/// The ports, as one deployment implements them.
#[derive(Clone)]
pub struct Adapters {
    pub runs: Arc<dyn Store>,
    pub keys: Arc<dyn KeyStore>,
    pub agents: Arc<dyn AgentStore>,
    pub webhooks: Arc<dyn WebhookStore>,
    pub queue: Arc<dyn RunQueue>,
    pub policies: Arc<dyn PolicyStore>,
}

/// How long API keys and agent definitions are trusted without a read,
/// where the configuration does not say.
#[derive(Debug, Clone, Copy)]
pub struct CacheDefaults {
    pub keys: Duration,
    pub agents: Duration,
}

impl CacheDefaults {
    /// A store across the network: a read saved is worth a short delay
    /// before a revocation or a changed definition is seen.
    pub const REMOTE: CacheDefaults = CacheDefaults { keys: Duration::from_secs(30), agents: Duration::from_secs(30) };
    /// A local file: a revocation is seen within a second (the contract
    /// allows 60) without a read per request, and a changed definition
    /// applies to the next run.
    pub const LOCAL: CacheDefaults = CacheDefaults { keys: Duration::from_secs(1), agents: Duration::ZERO };
}

pub struct Services {
    pub config: Config,
    pub adapters: Adapters,
    pub clock: Arc<dyn Clock>,
    caches: CacheDefaults,
    /// The AWS configuration for Bedrock, where the process loaded one
    /// (otherwise it is loaded on first use).
    sdk: Option<SdkConfig>,
    /// The agents the workers execute, made once and shared, so their
    /// definition cache and model clients are too.
    worker_agents: OnceLock<AgentRegistry>,
    /// Signs approval receipts (the worker's).
    receipts: Option<Receipts>,
    /// The keys the API's JWKS shows.
    signing_keys: Option<Arc<dyn PublishedKeys>>,
}

impl Services {
    pub fn new(config: Config, adapters: Adapters, caches: CacheDefaults) -> Self {
        Services {
            config,
            adapters,
            clock: Arc::new(SystemClock),
            caches,
            sdk: None,
            worker_agents: OnceLock::new(),
            receipts: None,
            signing_keys: None,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Tool calls an approval allowed carry receipts `receipts` signs.
    pub fn with_receipts(mut self, receipts: Receipts) -> Self {
        self.receipts = Some(receipts);
        self
    }

    /// Publishes the receipt key's public part where its signer does (a KMS
    /// key: into the table the JWKS is read from, at a process's first call
    /// and hourly after); a failure is logged and tried again at the next.
    pub async fn publish_signing_key(&self) {
        if let Some(receipts) = &self.receipts
            && let Err(error) = receipts.signer.public_key().await
        {
            tracing::warn!(%error, "the receipt key's public part could not be published");
        }
    }

    /// The API serves `keys` as its JWKS.
    pub fn with_signing_keys(mut self, keys: Arc<dyn PublishedKeys>) -> Self {
        self.signing_keys = Some(keys);
        self
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn with_sdk_config(mut self, sdk: SdkConfig) -> Self {
        self.sdk = Some(sdk);
        self
    }

    /// Built-in agents and defined ones (cached like API keys); with a
    /// runtime, the defined ones can also be executed.
    fn agents(&self, runtime: Option<Arc<LlmRuntime>>) -> AgentRegistry {
        let cache_for = self.config.agent_cache.unwrap_or(self.caches.agents);
        AgentRegistry::with_defined(&self.config.default_agent, self.adapters.agents.clone(), runtime, cache_for)
    }

    pub fn api(&self) -> Api {
        let key_cache = self.config.key_cache.unwrap_or(self.caches.keys);
        let api = Api::new(ApiParts {
            runs: self.adapters.runs.clone(),
            queue: self.adapters.queue.clone(),
            auth: Authenticator::new(self.adapters.keys.clone(), key_cache),
            agents: self.agents(None),
            clock: self.clock.clone(),
            policy: self.config.policy.clone(),
            limits: self.config.limits.clone(),
            webhooks: self.adapters.webhooks.clone(),
            webhook_allow_private: self.config.webhook_allow_private,
            shown: self.config.shown(),
            policies: self.adapters.policies.clone(),
        });
        match &self.signing_keys {
            Some(keys) => api.with_signing_keys(keys.clone()),
            None => api,
        }
    }

    pub fn worker(&self) -> Worker {
        let agents = self.worker_agents.get_or_init(|| {
            let mut runtime = LlmRuntime::from_process_env(self.config.max_checkpoint_bytes);
            if let Some(sdk) = &self.sdk {
                runtime = runtime.with_sdk_config(sdk.clone());
            }
            if let Some(receipts) = &self.receipts {
                runtime = runtime.with_receipts(receipts.clone());
            }
            self.agents(Some(Arc::new(runtime)))
        });
        Worker::new(self.adapters.runs.clone(), agents.clone(), self.clock.clone(), self.config.policy.clone())
            .with_policies(self.adapters.policies.clone())
    }

    /// Signs and sends webhook deliveries.
    pub fn deliverer(&self) -> Deliverer {
        Deliverer::new(DeliveryPolicy::new(self.config.webhook_allow_private), self.clock.clone())
            .showing(self.config.shown())
    }

    /// Delivers webhook events from whichever queue the deployment has,
    /// counting each attempt's outcome in `metrics` where given.
    pub fn webhook_engine(&self, metrics: Option<Arc<dyn MetricsSink>>) -> WebhookEngine {
        let mut deliverer = self.deliverer();
        if let Some(metrics) = metrics {
            deliverer = deliverer.with_metrics(metrics);
        }
        WebhookEngine::new(deliverer, self.adapters.runs.clone(), self.clock.clone())
    }

    pub fn sweeper(&self) -> Sweeper {
        Sweeper::new(
            self.adapters.runs.clone(),
            self.adapters.queue.clone(),
            self.clock.clone(),
            self.config.policy.clone(),
        )
    }
}
