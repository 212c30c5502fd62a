//! What every defined agent of a process shares (its HTTP and Bedrock
//! clients, the environment, limits, receipts), and how a definition
//! becomes an agent.

use std::sync::Arc;

use tokio::sync::OnceCell;

use super::LlmAgent;
use super::bedrock::{self, BedrockModel};
use super::model::{ChatModel, RetryPolicy};
use super::openai::OpenAiModel;
use super::questions;
use super::tools::{EnvLookup, Tool, ToolHttp};
use agent_runs_domain::{AgentDefinition, ProviderKind};
use agent_runs_ports::receipts::Receipts;

/// What every defined agent of a process shares: HTTP and Bedrock clients,
/// the environment for secrets, and limits.
pub struct LlmRuntime {
    /// Built on first use: loading the system's root certificates takes
    /// milliseconds that a cold start of a function without defined agents
    /// should not pay.
    http: std::sync::OnceLock<reqwest::Client>,
    /// The tools' clients: public addresses only, and any address (for
    /// definitions with `allow_private_network`). Neither follows redirects.
    tools_public: std::sync::OnceLock<reqwest::Client>,
    tools_private: std::sync::OnceLock<reqwest::Client>,
    bedrock: OnceCell<aws_sdk_bedrockruntime::Client>,
    /// Where the Bedrock client's configuration comes from; the default
    /// chain when absent.
    sdk: Option<aws_config::SdkConfig>,
    pub(super) env: EnvLookup,
    pub retry: RetryPolicy,
    pub max_checkpoint_bytes: usize,
    /// Signs the receipts of calls an approval allowed; without, calls
    /// carry none.
    pub(super) receipts: Option<Receipts>,
}

impl LlmRuntime {
    pub fn new(env: EnvLookup, max_checkpoint_bytes: usize) -> Self {
        Self {
            http: std::sync::OnceLock::new(),
            tools_public: std::sync::OnceLock::new(),
            tools_private: std::sync::OnceLock::new(),
            bedrock: OnceCell::new(),
            sdk: None,
            env,
            retry: RetryPolicy::default(),
            max_checkpoint_bytes,
            receipts: None,
        }
    }

    /// Calls an approval allowed carry a receipt these sign.
    pub fn with_receipts(self, receipts: Receipts) -> Self {
        Self { receipts: Some(receipts), ..self }
    }

    /// The HTTP client of OpenAI-compatible providers (whose address the
    /// operator sets, and the model cannot change).
    pub fn http(&self) -> reqwest::Client {
        self.http.get_or_init(|| build_client(|builder| builder)).clone()
    }

    /// The HTTP client of a definition's tools. It follows no redirect (a
    /// `3xx` goes back to the model as the tool's answer, and the tool's
    /// secret headers go nowhere else). Unless `allow_private_network`, it
    /// connects only to public addresses: names are resolved by
    /// [`crate::public_network::PublicAddressResolver`], and environment proxies
    /// are not used (a proxy would resolve the name itself, out of sight of
    /// the check).
    pub fn tool_http(&self, allow_private_network: bool) -> ToolHttp {
        let no_redirects = |builder: reqwest::ClientBuilder| builder.redirect(reqwest::redirect::Policy::none());
        let client = if allow_private_network {
            self.tools_private.get_or_init(|| build_client(no_redirects))
        } else {
            self.tools_public.get_or_init(|| {
                build_client(|builder| {
                    no_redirects(builder)
                        .no_proxy()
                        .dns_resolver(Arc::new(crate::public_network::PublicAddressResolver))
                })
            })
        };
        ToolHttp { client: client.clone(), public_only: !allow_private_network }
    }

    /// Reads secrets from the process environment.
    pub fn from_process_env(max_checkpoint_bytes: usize) -> Self {
        Self::new(Arc::new(|name| std::env::var(name).ok()), max_checkpoint_bytes)
    }

    /// Uses this Bedrock client (a test's) instead of building one.
    pub fn with_bedrock(self, client: aws_sdk_bedrockruntime::Client) -> Self {
        Self { bedrock: OnceCell::new_with(Some(client)), ..self }
    }

    /// Builds the Bedrock client, when first needed, from this configuration.
    pub fn with_sdk_config(self, sdk: aws_config::SdkConfig) -> Self {
        Self { sdk: Some(sdk), ..self }
    }

    async fn bedrock(&self) -> aws_sdk_bedrockruntime::Client {
        self.bedrock
            .get_or_init(|| async {
                let sdk = match &self.sdk {
                    Some(sdk) => sdk.clone(),
                    None => agent_runs_platform::aws_sdk::sdk_config().await,
                };
                // Retries are ours (inside the step's budget), not the SDK's
                // too. A call that hangs ends: long answers of large models
                // can take minutes, so the limit is generous and not retried.
                let timeouts =
                    aws_config::timeout::TimeoutConfig::builder().operation_timeout(bedrock::CALL_TIMEOUT).build();
                let config = aws_sdk_bedrockruntime::config::Builder::from(&sdk)
                    .retry_config(aws_config::retry::RetryConfig::disabled())
                    .timeout_config(timeouts)
                    .build();
                aws_sdk_bedrockruntime::Client::from_conf(config)
            })
            .await
            .clone()
    }

    /// The agent a definition describes.
    pub async fn agent(self: &Arc<Self>, definition: AgentDefinition) -> Result<LlmAgent, String> {
        let model: Arc<dyn ChatModel> = match definition.provider {
            ProviderKind::Openai => {
                let api_key = definition.api_key_env.as_deref().and_then(|name| (self.env)(name));
                Arc::new(OpenAiModel::new(self.http(), definition.base_url.as_deref(), api_key))
            }
            ProviderKind::Bedrock => Arc::new(BedrockModel::new(self.bedrock().await)),
        };
        // A tool whose schema no longer compiles (stored before a limit) is
        // left out, not the whole agent.
        let tools: Vec<Tool> = definition
            .tools
            .iter()
            .cloned()
            .filter_map(|tool| {
                let name = tool.name.clone();
                Tool::new(tool)
                    .inspect_err(|error| {
                        tracing::warn!(agent = %definition.name, tool = %name, %error, "a stored tool's schema does not compile; it is not offered");
                    })
                    .ok()
            })
            .collect();
        let specs = tools.iter().map(Tool::spec).chain(definition.ask_human.then(questions::spec)).collect();
        Ok(LlmAgent { definition, model, tools, specs, runtime: self.clone() })
    }
}

/// A client with this process's settings (user agent, root certificates),
/// as `configure` adjusts it.
pub fn build_client(configure: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder) -> reqwest::Client {
    agent_runs_platform::aws_sdk::use_ring_for_rustls();
    let builder =
        || configure(reqwest::Client::builder().user_agent(concat!("agent-runs/", env!("CARGO_PKG_VERSION"))));
    // The build fails only when the trust store (the system's, or
    // `SSL_CERT_FILE` / `SSL_CERT_DIR`) holds no readable certificate. Then
    // every HTTPS call fails as a provider or tool error; the process and
    // the other agents go on.
    builder().build().unwrap_or_else(|error| {
        tracing::error!(%error, "no trusted root certificate could be read; HTTPS calls of agents will fail");
        builder().tls_certs_only([]).build().expect("a client that reads no certificates builds")
    })
}
