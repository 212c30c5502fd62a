//! The AWS adapters: the DynamoDB store and the SQS queue, their SDK
//! clients built once per process, and the services made from them.

use std::sync::Arc;
use std::time::Duration;

use agent_runs_aws::DynamoStore;
use agent_runs_aws::KmsKey;
use agent_runs_aws::{SqsQueue, WebhookQueue};
use agent_runs_platform::aws_sdk::{sdk_config, store_call_timeouts};
use agent_runs_ports::queue::{NoQueue, RunQueue};
use agent_runs_ports::receipts::Receipts;
use agent_runs_service::config::Config;
use agent_runs_service::metrics::{EmfSink, Measured, MetricsSink};
use agent_runs_service::services::{Adapters, CacheDefaults, Services};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0} is not set; it names the AWS resource to use")]
    Missing(&'static str),
    #[error(transparent)]
    Config(#[from] agent_runs_service::config::ConfigError),
    #[error(transparent)]
    Telemetry(#[from] agent_runs_platform::telemetry::TelemetryError),
}

pub struct AwsServices {
    pub store: DynamoStore,
    /// Absent where a function sends nothing (get, list, cancel).
    pub queue: Option<SqsQueue>,
    /// The webhook delivery queue: the notifier's and deliver's.
    pub webhook_queue: Option<WebhookQueue>,
    pub services: Services,
}

impl AwsServices {
    pub async fn from_env() -> Result<Self, SetupError> {
        Self::from_config(Config::from_env()?).await
    }

    pub async fn from_config(config: Config) -> Result<Self, SetupError> {
        let sdk = sdk_config().await;
        let mut aws = Self::new(config, (&sdk).into(), (&sdk).into())?.signing_with((&sdk).into());
        aws.services = aws.services.with_sdk_config(sdk);
        Ok(aws)
    }

    /// Where `AGENT_RUNS_RECEIPT_KEY_ID` names a KMS key (the worker's),
    /// approval receipts are signed by it, through this configuration.
    pub fn signing_with(mut self, kms: aws_sdk_kms::Config) -> Self {
        if let Some(key_id) = self.services.config().receipt_key_id.clone() {
            let kms = kms.to_builder().timeout_config(store_call_timeouts()).build();
            let signer = KmsKey::new(aws_sdk_kms::Client::from_conf(kms), key_id, Arc::new(self.store.clone()));
            // The deployment's URL, which template.yaml passes.
            let issuer = self.services.config().issuer.clone().unwrap_or_else(|| "agent-runs".into());
            self.services = self.services.with_receipts(Receipts { signer: Arc::new(signer), issuer });
        }
        self
    }

    /// Builds the clients from their configurations (tests add
    /// interceptors), with the store call timeouts of [`agent_runs_platform::aws_sdk`].
    pub fn new(
        config: Config,
        dynamodb: aws_sdk_dynamodb::Config,
        sqs: aws_sdk_sqs::Config,
    ) -> Result<Self, SetupError> {
        let table = config.table.clone().ok_or(SetupError::Missing("AGENT_RUNS_TABLE"))?;
        let dynamodb = dynamodb.to_builder().timeout_config(store_call_timeouts()).build();
        let sqs = sqs.to_builder().timeout_config(store_call_timeouts()).build();
        let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(dynamodb), table)
            .showing(config.shown())
            .writing_events(config.event_format);
        let sqs = aws_sdk_sqs::Client::from_conf(sqs);
        let queue = config.queue_url.clone().map(|url| SqsQueue::new(sqs.clone(), url));
        let webhook_queue = config.webhook_queue_url.clone().map(|url| WebhookQueue::new(sqs, url));
        // A function configured without a queue fails its sends.
        let sends: Arc<dyn RunQueue> = match &queue {
            Some(queue) => Arc::new(queue.clone()),
            None => Arc::new(NoQueue),
        };
        agent_runs_platform::telemetry::init(&config.traces)?;
        let sink = config.emf_metrics.then(|| Arc::new(EmfSink) as Arc<dyn MetricsSink>);
        let runs = Measured::wrap(Arc::new(store.clone()), sink);
        let adapters = Adapters {
            runs,
            keys: Arc::new(store.clone()),
            agents: Arc::new(store.clone()),
            webhooks: Arc::new(store.clone()),
            queue: sends,
            policies: Arc::new(store.clone()),
        };
        let services =
            Services::new(config, adapters, CacheDefaults::REMOTE).with_signing_keys(Arc::new(store.clone()));
        Ok(AwsServices { store, queue, webhook_queue, services })
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
