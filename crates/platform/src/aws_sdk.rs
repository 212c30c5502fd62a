//! AWS SDK and TLS set-up shared by every client the service makes (the
//! store and queue adapters, Bedrock). Imports nothing else of the crate,
//! so any module may use it without tying the layers into a circle.

use std::time::Duration;

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

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
pub fn https_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    let client = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    SharedHttpClient::new(ConnectOnFirstUse(client))
}

/// An HTTP client that makes its first connector when a request needs it.
/// The smithy client makes one as soon as an SDK client is built, which
/// loads and parses the platform's root certificates (6 ms of a 17 ms
/// Lambda init here, more on a busy machine): inside every function's
/// init, which is billed. Made on first use, they load in the background
/// warm-up (`AwsServices::warm_up`) or with the first request instead.
#[derive(Debug)]
struct ConnectOnFirstUse(SharedHttpClient);

impl HttpClient for ConnectOnFirstUse {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        self.0.http_connector(settings, components)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.0.connector_metadata()
    }
}

/// Makes *ring* rustls's process-wide crypto provider, for the TLS clients
/// built without one of their own (reqwest). Later calls change nothing.
pub fn use_ring_for_rustls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The longest a DynamoDB or SQS call may take, retries included, and each
/// attempt of it. A hung call must end well inside the worker's deadline
/// margin, which also has to fit the write that hands the run back. Calls
/// normally take milliseconds. Only these clients: a model call through
/// Bedrock takes far longer.
pub const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
pub const STORE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

pub fn store_call_timeouts() -> TimeoutConfig {
    TimeoutConfig::builder()
        .operation_timeout(STORE_CALL_TIMEOUT)
        .operation_attempt_timeout(STORE_ATTEMPT_TIMEOUT)
        .build()
}
