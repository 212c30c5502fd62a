//! A stand-in for the Lambda Runtime API, to time a function binary the way
//! Lambda runs it: start the process with the usual Lambda environment,
//! measure exec -> first `GET /runtime/invocation/next` (init: SDK clients
//! built, connections warmed), then the first invocation and warm ones.
//! Usage: lambda-cold-start BINARY EVENT_JSON_FILE [WARM_INVOCATIONS]
//! (the AWS and AGENT_RUNS_* variables are passed through from the caller);
//! `lambda-cold-start --init-only STARTS BINARY` starts it STARTS times,
//! one after another, each stopped at its first request for work, and
//! prints the median, least and most init.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_runs_bench::{millis, percentile};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The function's name, as its binary's file name.
fn function_name(binary: &str) -> String {
    std::path::Path::new(binary).file_name().unwrap().to_string_lossy().into_owned()
}

/// What one start of the function showed.
struct Started {
    init: Option<Duration>,
    durations: Vec<Duration>,
    errors: Vec<String>,
}

struct State {
    started: Instant,
    event: Bytes,
    invocations: usize,
    sent: usize,
    init: Option<Duration>,
    delivered_at: Option<Instant>,
    durations: Vec<Duration>,
    errors: Vec<String>,
    done: Arc<Notify>,
}

async fn handle(state: Arc<Mutex<State>>, request: http::Request<Incoming>) -> http::Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let ok = |body: Bytes| http::Response::new(Full::new(body));
    if path == "/2018-06-01/runtime/invocation/next" {
        let event = {
            let mut state = state.lock().unwrap();
            let since_start = state.started.elapsed();
            state.init.get_or_insert(since_start);
            if state.sent == state.invocations {
                state.done.notify_one();
                None
            } else {
                state.sent += 1;
                state.delivered_at = Some(Instant::now());
                Some((state.sent, state.event.clone()))
            }
        };
        let Some((n, event)) = event else {
            // No more work: hold the request, as Lambda does between invocations.
            std::future::pending::<()>().await;
            unreachable!();
        };
        let deadline =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap() + Duration::from_secs(30);
        let mut response = ok(event);
        let headers = response.headers_mut();
        headers.insert("lambda-runtime-aws-request-id", format!("bench-{n}").parse().unwrap());
        headers.insert("lambda-runtime-deadline-ms", deadline.as_millis().to_string().parse().unwrap());
        headers.insert(
            "lambda-runtime-invoked-function-arn",
            "arn:aws:lambda:us-east-1:123456789012:function:bench".parse().unwrap(),
        );
        headers.insert("lambda-runtime-trace-id", "Root=1-00000000-000000000000000000000000".parse().unwrap());
        return response;
    }
    let mut state = state.lock().unwrap();
    if path.ends_with("/response") {
        let took = state.delivered_at.take().map(|at| at.elapsed()).unwrap_or_default();
        state.durations.push(took);
    } else {
        state.errors.push(format!("{path}: {}", String::from_utf8_lossy(&body)));
        if path.contains("/init/error") {
            state.done.notify_one();
        }
    }
    let mut response = ok(Bytes::from_static(b"{}"));
    *response.status_mut() = http::StatusCode::ACCEPTED;
    response
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.next_if_eq("--init-only").is_some() {
        let starts: usize = args.next().expect("STARTS").parse().expect("a number");
        let binary = args.next().expect("BINARY");
        let mut inits = Vec::new();
        let name = function_name(&binary);
        for _ in 0..starts {
            let started = start(&binary, Bytes::new(), 0).await;
            match started.init {
                Some(init) if started.errors.is_empty() => inits.push(init),
                _ => {
                    eprintln!("{name}: did not ask for work: {:?}", &started.errors[..started.errors.len().min(3)]);
                    std::process::exit(1);
                }
            }
        }
        inits.sort();
        println!(
            "{name:<12} init alone: median {:>9}  least {:>9}  most {:>9}  ({starts} starts)",
            millis(percentile(&inits, 50.0)),
            millis(inits.first().copied().unwrap_or_default()),
            millis(inits.last().copied().unwrap_or_default()),
        );
        return;
    }
    let binary = args.next().expect("BINARY");
    let event = std::fs::read(args.next().expect("EVENT_JSON_FILE")).expect("read event");
    let warm: usize = args.next().map_or(100, |n| n.parse().expect("a number"));
    let state = start(&binary, Bytes::from(event), 1 + warm).await;
    let name = function_name(&binary);
    if !state.errors.is_empty() {
        eprintln!("{name}: errors: {:?}", &state.errors[..state.errors.len().min(3)]);
        std::process::exit(1);
    }
    let mut warm_durations = state.durations.iter().skip(1).copied().collect::<Vec<_>>();
    warm_durations.sort();
    println!(
        "{name:<8} init {:>9}  first invocation {:>9}  warm p50 {:>9}  p99 {:>9}",
        millis(state.init.unwrap_or_default()),
        millis(state.durations.first().copied().unwrap_or_default()),
        millis(percentile(&warm_durations, 50.0)),
        millis(percentile(&warm_durations, 99.0)),
    );
}

/// Starts the function, hands it `invocations` times the event, and stops
/// it once it asks for more (at its first request when `invocations` is 0).
async fn start(binary: &str, event: Bytes, invocations: usize) -> Started {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap().to_string();
    let done = Arc::new(Notify::new());
    let state = Arc::new(Mutex::new(State {
        started: Instant::now(),
        event,
        invocations,
        sent: 0,
        init: None,
        delivered_at: None,
        durations: Vec::new(),
        errors: Vec::new(),
        done: done.clone(),
    }));
    let server_state = state.clone();
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let state = server_state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(state, request).await) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });

    let name = function_name(binary);
    state.lock().unwrap().started = Instant::now();
    let mut child = std::process::Command::new(binary)
        .env("AWS_LAMBDA_RUNTIME_API", &api)
        .env("AWS_LAMBDA_FUNCTION_NAME", &name)
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}"))
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AGENT_RUNS_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the function");
    if tokio::time::timeout(Duration::from_secs(60), done.notified()).await.is_err() {
        eprintln!("{name}: timed out");
    }
    let _ = child.kill();
    let _ = child.wait();
    server.abort();
    let mut state = state.lock().unwrap();
    Started {
        init: state.init,
        durations: std::mem::take(&mut state.durations),
        errors: std::mem::take(&mut state.errors),
    }
}
