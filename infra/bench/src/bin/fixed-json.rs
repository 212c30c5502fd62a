//! The ceiling: a minimal hyper HTTP/1.1 server that answers every request
//! with the same JSON body: a small run, or the bytes of BODY_FILE (the list
//! ceiling: a page of runs as the service answered it).
//! Usage: fixed-json ADDR [BODY_FILE]

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &str = r#"{"id":"run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9","status":"succeeded","agent":"echo","input":"hello","output":"hello","error":null,"pending_approvals":[],"metadata":{},"created_at":"2026-11-21T23:24:38.123Z","started_at":"2026-11-21T23:24:38.124Z","completed_at":"2026-11-21T23:24:38.125Z"}"#;

#[tokio::main]
async fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    let body = match std::env::args().nth(2) {
        Some(path) => Bytes::from(std::fs::read(&path).expect("read the body file")),
        None => Bytes::from_static(BODY.as_bytes()),
    };
    let listener = TcpListener::bind(&addr).await.expect("bind");
    println!("Listening on http://{}", listener.local_addr().unwrap());
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        stream.set_nodelay(true).unwrap();
        let body = body.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_request| {
                let body = body.clone();
                async move {
                    let mut response = http::Response::new(Full::new(body));
                    response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
