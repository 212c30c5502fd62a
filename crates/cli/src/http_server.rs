//! Serves the shared [`Api`] over HTTP/1.1 with hyper: the embedded
//! server's stand-in for API Gateway.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agent_runs_service::api::{
    Api, ApiError, BodyCutShort, BodyTimedOut, BodyTooLarge, CanStream, EventStream, MAX_BODY_BYTES,
    asks_for_event_stream,
};
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Either, Full, LengthLimitError, Limited, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What one client may hold of the server: connections and time.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A connection that has not sent a whole request head (request line and
    /// headers) this long after it opened, or after its previous answer, is
    /// closed: this covers idle keep-alive connections too.
    pub header_timeout: Duration,
    /// Reading a request's body may take this long; beyond it the request is
    /// answered `408` and the connection closed.
    pub body_timeout: Duration,
    /// Connections open at once; when all are taken, no more are accepted
    /// (they wait in the listen backlog) until one closes.
    pub max_connections: usize,
    /// A connection whose answer cannot be written for this long (its
    /// client stopped reading) is closed, with what it held: an event
    /// stream is written only as its client reads.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// A connection whose writes stay blocked longer than its limit fails
/// them: hyper then closes it.
struct WriteStallTimeout<S> {
    inner: S,
    limit: Duration,
    /// Since when the writes have been blocked.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteStallTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteStallTimeout { inner, limit, stalled: None }
    }

    /// After a write that made no progress: the error once the limit is up.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(&mut self, result: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.blocked(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteStallTimeout<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteStallTimeout<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(result, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(result, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(result, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The first wait after a failed `accept` (for example out of file
/// descriptors), doubled at each failure in a row up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The wait after `failures` failed accepts in a row (at least one).
fn accept_backoff(failures: u32) -> Duration {
    ACCEPT_BACKOFF_MIN.saturating_mul(1 << failures.clamp(1, 8).saturating_sub(1)).min(ACCEPT_BACKOFF_MAX)
}

/// Reads the body up to the limit and within `timeout`; a longer one is
/// marked, not read, and so is one that took too long.
async fn into_api_request(request: Request<Incoming>, timeout: Duration) -> Request<Bytes> {
    let (mut parts, body) = request.into_parts();
    let declared_too_large = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|length| length > MAX_BODY_BYTES as u64);
    let bytes = if declared_too_large {
        None
    } else {
        match tokio::time::timeout(timeout, Limited::new(body, MAX_BODY_BYTES).collect()).await {
            Ok(Ok(collected)) => Some(collected.to_bytes()),
            Ok(Err(error)) if error.downcast_ref::<LengthLimitError>().is_some() => None,
            Ok(Err(_)) => {
                // The connection ended (or broke) before the body's declared
                // length arrived: never act on a part of a request.
                parts.extensions.insert(BodyCutShort);
                Some(Bytes::new())
            }
            Err(_) => {
                parts.extensions.insert(BodyTimedOut);
                Some(Bytes::new())
            }
        }
    };
    if bytes.is_none() {
        parts.extensions.insert(BodyTooLarge);
    }
    Request::from_parts(parts, bytes.unwrap_or_default())
}

/// The URL the service bound to `addr` is known by (bound to every
/// address, by this machine's name for itself).
pub fn base_url(addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() { format!("http://localhost:{}", addr.port()) } else { format!("http://{addr}") }
}

/// Serves the embedded API.
pub async fn serve(listener: TcpListener, api: Arc<Api>, limits: ConnectionLimits, shutdown: impl Future<Output = ()>) {
    // Event streams never end by themselves while their run goes on: on
    // shutdown they are told to, so open connections can finish.
    let (close_streams, closing) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = close_streams.send(true);
    };
    serve_with_limits(listener, limits, shutdown, move |request| {
        let (api, closing) = (api.clone(), closing.clone());
        async move {
            let mut request = into_api_request(request, limits.body_timeout).await;
            // The rest of an oversized or stalled body is never read: tell
            // the client not to send another request on this connection.
            let extensions = request.extensions();
            let unread_body = extensions.get::<BodyTooLarge>().is_some()
                || extensions.get::<BodyTimedOut>().is_some()
                || extensions.get::<BodyCutShort>().is_some();
            if asks_for_event_stream(request.headers()) {
                request.extensions_mut().insert(CanStream);
            }
            // A change gets its own task: a client that goes away mid-request
            // must not cut an operation off between its writes (a create
            // stored but not yet queued would wait for the sweeper). A read
            // writes nothing, so it is answered in place, sparing the move
            // of its future into a task. Either way a panic is a 500.
            let answered = if matches!(*request.method(), Method::GET | Method::HEAD) {
                AssertUnwindSafe(api.handle(request)).catch_unwind().await.ok()
            } else {
                tokio::spawn(async move { api.handle(request).await }).await.ok()
            };
            let mut response =
                answered.unwrap_or_else(|| ApiError::Internal("the request's task panicked".into()).into_response());
            // Taken out, so what the stream holds is given back with its body.
            let stream = response.extensions_mut().remove::<EventStream>();
            let mut response = response.map(|body| match stream {
                // A run's events as Server-Sent Events: the stream is the body.
                Some(stream) => Either::Right(BodyExt::boxed_unsync(StreamBody::new(
                    stream.frames(closing).map(|frame| Ok::<_, Infallible>(Frame::data(frame))),
                ))),
                None => Either::Left(Full::new(body)),
            });
            if unread_body {
                response.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            response
        }
    })
    .await
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown`, with the
/// default [`ConnectionLimits`].
pub async fn serve_with<H, F>(listener: TcpListener, shutdown: impl Future<Output = ()>, handler: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve_with_limits(listener, ConnectionLimits::default(), shutdown, handler).await
}

/// Serves HTTP/1.1 on `listener` with `handler` until `shutdown`, then lets
/// open connections finish for up to 10 seconds. At most
/// `limits.max_connections` are open at once; a connection that is slow to
/// send its request head is closed after `limits.header_timeout` (reading
/// the body is the handler's to bound).
pub async fn serve_with_limits<H, F, B>(
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(limits.max_connections.clamp(1, Semaphore::MAX_PERMITS)));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    'serving: loop {
        // A free slot first: while every slot is taken, connections wait in
        // the listen backlog instead of being accepted and dropped.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let mut failures = 0;
        let stream = loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => break stream,
                    Err(error) => {
                        // Out of file descriptors (EMFILE) and the like: wait
                        // for some to be freed instead of spinning.
                        failures += 1;
                        let wait = accept_backoff(failures);
                        tracing::warn!(error = %error, retry_in_ms = wait.as_millis() as u64, "accept failed");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = &mut shutdown => break 'serving,
                        }
                    }
                },
                _ = &mut shutdown => break 'serving,
            }
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let response = handler(request);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let stream = WriteStallTimeout::new(stream, limits.write_timeout);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(std::time::Duration::from_secs(10), graceful.shutdown()).await.is_err() {
        tracing::warn!("open connections did not finish within 10 s");
    }
}

/// Answers `GET /metrics` with the registry in Prometheus text format, and
/// anything else with `404`, until the process ends.
pub async fn serve_metrics(listener: TcpListener, registry: Arc<agent_runs_service::metrics::Registry>) {
    // A scraper needs one connection: a few, each closed after its answer
    // or when its request is slow, so this port cannot hold the process's
    // file descriptors.
    let connections = Arc::new(Semaphore::new(METRICS_CONNECTIONS));
    let mut failures = 0;
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                failures = 0;
                stream
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, "accepting a metrics connection failed");
                tokio::time::sleep(accept_backoff(failures)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let registry = registry.clone();
                async move {
                    let found = request.uri().path() == "/metrics" && request.method() == http::Method::GET;
                    let (status, body) = if found {
                        (http::StatusCode::OK, registry.render())
                    } else {
                        (http::StatusCode::NOT_FOUND, "Metrics are at /metrics.\n".to_owned())
                    };
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    let content_type = http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");
                    response.headers_mut().insert(header::CONTENT_TYPE, content_type);
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(Duration::from_secs(10), connection).await;
            drop(permit);
        });
    }
}

/// Connections the metrics listener serves at once.
const METRICS_CONNECTIONS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that stops reading fails the writes once they have been
    /// blocked for the limit; one that reads again in time resets the clock.
    #[tokio::test(start_paused = true)]
    async fn writes_blocked_past_the_limit_fail_and_progress_resets_the_clock() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (near, mut far) = tokio::io::duplex(64);
        let mut guarded = WriteStallTimeout::new(near, Duration::from_secs(30));
        guarded.write_all(&[0; 64]).await.unwrap();
        // Blocked 20 s, then the peer reads: the next write goes through.
        let write = tokio::spawn(async move {
            let result = guarded.write_all(&[1; 64]).await;
            (guarded, result)
        });
        tokio::time::sleep(Duration::from_secs(20)).await;
        let mut read = [0; 64];
        far.read_exact(&mut read).await.unwrap();
        let (mut guarded, result) = write.await.unwrap();
        result.unwrap();
        // Blocked again: the clock starts anew, and the write fails 30 s on.
        let started = tokio::time::Instant::now();
        let error = guarded.write_all(&[2; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        drop(far);
    }

    #[test]
    fn a_failing_accept_is_retried_ever_more_slowly_up_to_a_second() {
        let waits: Vec<u64> = (1..=8).map(|failures| accept_backoff(failures).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(accept_backoff(u32::MAX), ACCEPT_BACKOFF_MAX);
    }
}
