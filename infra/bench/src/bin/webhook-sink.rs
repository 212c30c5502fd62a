//! A webhook receiver for the benchmarks: answers every POST with 204
//! after `DELAY_MS` and counts them; `GET /count` answers the count.
//! Usage: webhook-sink ADDR DELAY_MS

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let delay = Duration::from_millis(args.next().and_then(|ms| ms.parse().ok()).unwrap_or(0));
    let listener = TcpListener::bind(&addr).await.expect("bind");
    println!("Listening on http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await.expect("accept");
        let count = count.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let count = count.clone();
                async move {
                    let body = if request.method() == http::Method::GET {
                        Bytes::from(count.load(Ordering::Relaxed).to_string())
                    } else {
                        tokio::time::sleep(delay).await;
                        count.fetch_add(1, Ordering::Relaxed);
                        Bytes::new()
                    };
                    let mut response = http::Response::new(Full::new(body));
                    if request.method() != http::Method::GET {
                        *response.status_mut() = http::StatusCode::NO_CONTENT;
                    }
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
