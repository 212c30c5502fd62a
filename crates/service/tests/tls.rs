//! The AWS clients and the HTTP client of defined agents reach their
//! endpoints over TLS (rustls on ring) and refuse a server whose certificate
//! no trusted CA signed. The emulator speaks plain HTTP, so this test serves TLS itself with
//! the certificates in `fixtures/tls` (see the README there).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent_runs_agents::llm::LlmRuntime;
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls");

/// A DynamoDB stand-in on `https://localhost:<port>` presenting the named
/// fixture certificate; every request it receives is counted and answered
/// with DynamoDB's "table not found".
async fn serve_tls(certificate: &str) -> (u16, Arc<AtomicUsize>) {
    let chain = CertificateDer::pem_file_iter(format!("{FIXTURES}/{certificate}.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(format!("{FIXTURES}/{certificate}.key")).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else { return };
                let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ResourceNotFoundException","message":"Requested resource not found"}"#;
                    let response = Response::builder()
                        .status(400)
                        .header("content-type", "application/x-amz-json-1.0")
                        .body(Full::new(Bytes::from_static(body.as_bytes())));
                    async move { Ok::<_, Infallible>(response.unwrap()) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    (port, requests)
}

async fn dynamodb_at(port: u16) -> aws_sdk_dynamodb::Client {
    let sdk = agent_runs_platform::aws_sdk::sdk_config_loader()
        .endpoint_url(format!("https://localhost:{port}"))
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .load()
        .await;
    aws_sdk_dynamodb::Client::new(&sdk)
}

async fn get_item(client: &aws_sdk_dynamodb::Client) -> Result<(), SdkError<impl std::error::Error>> {
    client.get_item().table_name("runs").key("pk", AttributeValue::S("x".into())).send().await.map(|_| ())
}

/// The HTTP client a fresh runtime builds, as defined agents get it.
fn agents_http_client() -> reqwest::Client {
    LlmRuntime::new(Arc::new(|_| None), 1024).http()
}

#[tokio::test]
async fn clients_speak_tls_and_check_the_certificate() {
    // The only test of this binary, so no other thread reads the environment.
    // The clients take the system's roots, or only these files' when either is
    // set; some machines set SSL_CERT_DIR to the system's roots.
    unsafe {
        std::env::set_var("SSL_CERT_FILE", format!("{FIXTURES}/trusted-ca.pem"));
        std::env::remove_var("SSL_CERT_DIR");
    }

    let (port, requests) = serve_tls("trusted-localhost").await;
    let client = dynamodb_at(port).await;
    let error = get_item(&client).await.expect_err("the stand-in answers table not found");
    match error {
        SdkError::ServiceError(service) => {
            assert!(format!("{:?}", service.err()).contains("ResourceNotFound"), "{:?}", service.err())
        }
        other => panic!("the request should have reached the server over TLS: {other:?}"),
    }
    assert!(requests.load(Ordering::SeqCst) >= 1);

    // Same name, but signed by a CA that is not trusted: no request is sent.
    let (port, requests) = serve_tls("untrusted-localhost").await;
    let client = dynamodb_at(port).await;
    let error = get_item(&client).await.expect_err("an untrusted certificate is refused");
    assert!(matches!(error, SdkError::DispatchFailure(_)), "{error:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);

    // The client of OpenAI-compatible providers and HTTP tools, likewise.
    let (trusted_port, trusted_requests) = serve_tls("trusted-localhost").await;
    let client = agents_http_client();
    let response = client.get(format!("https://localhost:{trusted_port}/")).send().await.expect("reached over TLS");
    assert_eq!(response.status(), 400);
    assert_eq!(trusted_requests.load(Ordering::SeqCst), 1);
    let (port, requests) = serve_tls("untrusted-localhost").await;
    let error = client.get(format!("https://localhost:{port}/")).send().await.expect_err("untrusted");
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);

    // The tools' client too (with the private network opt-in: the server is local).
    let tools = LlmRuntime::new(Arc::new(|_| None), 1024).tool_http(true).client;
    let (port, requests) = serve_tls("trusted-localhost").await;
    let response = tools.get(format!("https://localhost:{port}/")).send().await.expect("reached over TLS");
    assert_eq!(response.status(), 400);
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    let (port, requests) = serve_tls("untrusted-localhost").await;
    let error = tools.get(format!("https://localhost:{port}/")).send().await.expect_err("untrusted");
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);

    // A trust store with no readable certificate: the client is still built
    // (no panic), and it trusts nobody.
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap();
    unsafe { std::env::set_var("SSL_CERT_FILE", junk.path()) };
    let error = agents_http_client()
        .get(format!("https://localhost:{trusted_port}/"))
        .send()
        .await
        .expect_err("nobody is trusted");
    assert!(error.is_connect(), "{error:?}");
    assert_eq!(trusted_requests.load(Ordering::SeqCst), 1);
}
