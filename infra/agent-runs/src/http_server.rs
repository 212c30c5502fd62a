//! Serves the shared [`Api`] over HTTP/1.1 with hyper: the embedded
//! server's stand-in for API Gateway.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use agent_runs_shared::api::{Api, BodyTooLarge, MAX_BODY_BYTES};
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// Reads the body up to the limit; a longer one is marked, not read.
async fn into_api_request(request: Request<Incoming>) -> Request<Bytes> {
    let (mut parts, body) = request.into_parts();
    let declared_too_large = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|length| length > MAX_BODY_BYTES as u64);
    let bytes = if declared_too_large {
        None
    } else {
        match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(collected) => Some(collected.to_bytes()),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => None,
            Err(_) => Some(Bytes::new()),
        }
    };
    if bytes.is_none() {
        parts.extensions.insert(BodyTooLarge);
    }
    Request::from_parts(parts, bytes.unwrap_or_default())
}

/// Serves the embedded API.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: impl Future<Output = ()>) {
    serve_with(listener, shutdown, move |request| {
        let api = api.clone();
        async move {
            let request = into_api_request(request).await;
            // The rest of an oversized body is never read: tell the client
            // not to send another request on this connection.
            let unread_body = request.extensions().get::<BodyTooLarge>().is_some();
            let mut response = api.handle(request).await.map(Full::new);
            if unread_body {
                response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            response
        }
    })
    .await
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown`, then lets
/// open connections finish for up to 10 seconds.
pub async fn serve_with<H, F>(listener: TcpListener, shutdown: impl Future<Output = ()>, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(error = %error, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let response = handler(request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(std::time::Duration::from_secs(10), graceful.shutdown()).await.is_err() {
        tracing::warn!("open connections did not finish within 10 s");
    }
}
