//! The AWS path's services, built once per process: SDK clients, the
//! DynamoDB store and the SQS queue, and what is made from them.

use std::sync::Arc;
use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};

use crate::agents::AgentRegistry;
use crate::agents::llm::LlmRuntime;
use crate::api::Api;
use crate::auth::{Authenticator, REMOTE_STORE_CACHE_TTL};
use crate::config::Config;
use crate::domain::{Clock, SystemClock};
use crate::queue::{RunQueue, SqsQueue};
use crate::store::{DynamoStore, KeyStore, RunStore};
use crate::worker::{Sweeper, Worker};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0} is not set; it names the AWS resource to use")]
    Missing(&'static str),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// The shared SDK configuration: region, credentials and endpoint (an
/// emulator through `AWS_ENDPOINT_URL`) from the standard AWS variables.
pub async fn sdk_config() -> SdkConfig {
    sdk_config_loader().load().await
}

/// The SDK's defaults over our HTTPS client; tests add their own settings.
pub fn sdk_config_loader() -> aws_config::ConfigLoader {
    aws_config::defaults(BehaviorVersion::latest()).http_client(https_client())
}

/// rustls on *ring* rather than the SDK's default aws-lc: the same TLS 1.2/1.3
/// suites, and every function 2 MB smaller (docs/benchmarks.md, "Function
/// sizes"). The SDK's own default client is not compiled in.
pub fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https()
}

/// Makes *ring* rustls's process-wide crypto provider, for the TLS clients
/// built without one of their own (reqwest). Later calls change nothing.
pub fn use_ring_for_rustls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The longest a DynamoDB or SQS call may take, retries included, and each
/// attempt of it. A hung call must end well inside the worker's deadline
/// margin (`AGENT_RUNS_WORKER_DEADLINE_MARGIN_MS`, 10 s), which also has to
/// fit the write that hands the run back. Calls normally take milliseconds.
/// Only these clients: a model call through Bedrock takes far longer.
pub const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
pub const STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

fn store_call_timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .operation_timeout(STORE_CALL_TIMEOUT)
        .operation_attempt_timeout(STORE_ATTEMPT_TIMEOUT)
        .build()
}

pub struct AwsServices {
    pub config: Config,
    pub store: DynamoStore,
    /// Absent where a function sends nothing (get, list, cancel).
    pub queue: Option<SqsQueue>,
    pub clock: Arc<dyn Clock>,
    /// The shared AWS configuration, for the Bedrock client of defined
    /// agents (built on first use: most functions never need it).
    sdk: Option<SdkConfig>,
}

impl AwsServices {
    pub async fn from_env() -> Result<Self, SetupError> {
        let config = Config::from_env()?;
        let sdk = sdk_config().await;
        let mut services = Self::new(config, (&sdk).into(), (&sdk).into())?;
        services.sdk = Some(sdk);
        Ok(services)
    }

    /// Builds the clients from their configurations (tests add
    /// interceptors), with [`STORE_CALL_TIMEOUT`] and [`STORE_ATTEMPT_TIMEOUT`].
    pub fn new(
        config: Config,
        dynamodb: aws_sdk_dynamodb::Config,
        sqs: aws_sdk_sqs::Config,
    ) -> Result<Self, SetupError> {
        let table = config.table.clone().ok_or(SetupError::Missing("AGENT_RUNS_TABLE"))?;
        let dynamodb = dynamodb.to_builder().timeout_config(store_call_timeouts()).build();
        let sqs = sqs.to_builder().timeout_config(store_call_timeouts()).build();
        let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(dynamodb), table);
        let queue = config.queue_url.clone().map(|url| SqsQueue::new(aws_sdk_sqs::Client::from_conf(sqs), url));
        Ok(AwsServices { config, store, queue, clock: Arc::new(SystemClock), sdk: None })
    }

    /// Built-in agents and those defined in the table, known by name.
    /// Definitions are cached like API keys: a change is seen within the
    /// cache time.
    fn agents(&self, runtime: Option<Arc<LlmRuntime>>) -> AgentRegistry {
        let cache_for = self.config.agent_cache.unwrap_or(REMOTE_STORE_CACHE_TTL);
        AgentRegistry::with_defined(&self.config.default_agent, Arc::new(self.store.clone()), runtime, cache_for)
    }

    /// What executes defined agents: their providers (Bedrock with this
    /// process's AWS configuration) and tools.
    fn llm_runtime(&self) -> Arc<LlmRuntime> {
        let mut runtime = LlmRuntime::from_process_env(self.config.max_checkpoint_bytes);
        if let Some(sdk) = &self.sdk {
            runtime = runtime.with_sdk_config(sdk.clone());
        }
        Arc::new(runtime)
    }

    fn runs(&self) -> Arc<dyn RunStore> {
        Arc::new(self.store.clone())
    }

    /// The queue to send to; a function configured without one fails its sends.
    pub fn queue(&self) -> Arc<dyn RunQueue> {
        match &self.queue {
            Some(queue) => Arc::new(queue.clone()),
            None => Arc::new(crate::queue::NoQueue),
        }
    }

    pub fn api(&self) -> Api {
        let keys: Arc<dyn KeyStore> = Arc::new(self.store.clone());
        Api::new(
            self.runs(),
            self.queue(),
            Authenticator::new(keys, self.config.key_cache.unwrap_or(REMOTE_STORE_CACHE_TTL)),
            self.agents(None),
            self.clock.clone(),
            self.config.policy.clone(),
            self.config.limits.clone(),
        )
    }

    pub fn worker(&self) -> Worker {
        Worker::new(self.runs(), self.agents(Some(self.llm_runtime())), self.clock.clone(), self.config.policy.clone())
    }

    pub fn sweeper(&self) -> Sweeper {
        Sweeper::new(self.runs(), self.queue(), self.clock.clone(), self.config.policy.clone())
    }

    /// Opens the connections a cold function will need, in the background,
    /// so its first request is less likely to pay for DNS and TLS set-up
    /// while init does not wait on the network. Failures are ignored: the
    /// request path reports them properly.
    pub fn warm_up(&self) {
        let (store, queue) = (self.store.clone(), self.queue.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let sqs = async {
                if let Some(queue) = &queue {
                    queue.warm_up().await;
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(store.warm_up(), sqs) }).await;
            tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "connections warmed");
        });
    }
}
