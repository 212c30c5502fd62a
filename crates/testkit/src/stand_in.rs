//! A stand-in for an OpenAI-compatible provider and for the tools an agent
//! calls, on one local HTTP server. The model answers from a script of
//! turns; every model request and every tool call is recorded.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub enum Turn {
    /// A 200 with this chat-completion body.
    Reply(Value),
    /// An error status, with `Retry-After` seconds when given.
    Fail(u16, Option<u32>),
}

/// A tool call as the tool endpoint received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    pub method: String,
    /// Path and query.
    pub target: String,
    pub body: String,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    /// The approval receipt (`Agent-Runs-Approval`), if the call had one.
    pub receipt: Option<String>,
}

#[derive(Default)]
struct State {
    turns: VecDeque<Turn>,
    model_requests: Vec<Value>,
    model_authorization: Vec<Option<String>>,
    tool_calls: Vec<RecordedCall>,
    /// How long a tool takes to answer, after recording the call.
    tool_delay: std::time::Duration,
    /// How long the model takes to answer, after recording the request.
    model_delay: std::time::Duration,
    /// When set, tools answer `302 Found` to this URL (after recording the call).
    tool_redirect: Option<String>,
}

#[derive(Clone)]
pub struct StandIn {
    /// `http://127.0.0.1:<port>`; the model is at `/v1/chat/completions`,
    /// tools at any path under `/tools/`.
    pub url: String,
    state: Arc<Mutex<State>>,
}

pub fn reply(message: Value) -> Turn {
    Turn::Reply(json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
}

pub fn text(content: &str) -> Turn {
    reply(json!({"role": "assistant", "content": content}))
}

/// A turn that calls one tool; `arguments` is sent as is (it may be malformed).
pub fn tool_call(id: &str, name: &str, arguments: &str) -> Turn {
    reply(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
    ]}))
}

fn header(request: &Request<Incoming>, name: &str) -> Option<String> {
    request.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned)
}

impl StandIn {
    pub async fn start() -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(state.clone(), request));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        StandIn { url, state }
    }

    pub fn script(&self, turns: Vec<Turn>) {
        self.state.lock().unwrap().turns = turns.into();
    }

    pub fn model_requests(&self) -> Vec<Value> {
        self.state.lock().unwrap().model_requests.clone()
    }

    pub fn model_authorization(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().model_authorization.clone()
    }

    pub fn delay_model(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().model_delay = delay;
    }

    pub fn delay_tools(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().tool_delay = delay;
    }

    /// Tools answer `302 Found` with `Location: <location>`.
    pub fn redirect_tools_to(&self, location: &str) {
        self.state.lock().unwrap().tool_redirect = Some(location.to_owned());
    }

    pub fn tool_calls(&self) -> Vec<RecordedCall> {
        self.state.lock().unwrap().tool_calls.clone()
    }
}

async fn handle(state: Arc<Mutex<State>>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let target = request.uri().path_and_query().map(|target| target.to_string()).unwrap_or_default();
    let idempotency_key = header(&request, "idempotency-key");
    let authorization = header(&request, "authorization");
    let receipt = header(&request, "agent-runs-approval");
    let body = request.into_body().collect().await.map(|body| body.to_bytes()).unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    let call = RecordedCall { method, target, body, idempotency_key, authorization, receipt };
    let (response, delay) = answer(&mut state.lock().unwrap(), call);
    tokio::time::sleep(delay).await;
    Ok(response.unwrap())
}

/// The response, and how long to wait before sending it.
fn answer(
    state: &mut State,
    call: RecordedCall,
) -> (Result<Response<Full<Bytes>>, hyper::http::Error>, std::time::Duration) {
    let RecordedCall { target, body, authorization, .. } = &call;
    let (target, body, authorization) = (target.clone(), body.clone(), authorization.clone());
    let respond = |status: u16, body: String| {
        Response::builder().status(status).header("content-type", "application/json").body(Full::new(Bytes::from(body)))
    };
    let response = if target == "/v1/chat/completions" {
        state.model_requests.push(serde_json::from_str(&body).unwrap_or(Value::Null));
        state.model_authorization.push(authorization);
        let response = match state.turns.pop_front() {
            Some(Turn::Reply(completion)) => respond(200, completion.to_string()),
            Some(Turn::Fail(status, retry_after)) => {
                let mut response = respond(status, json!({"error": {"message": "stand-in failure"}}).to_string());
                if let (Ok(response), Some(seconds)) = (&mut response, retry_after) {
                    response.headers_mut().insert("retry-after", seconds.into());
                }
                response
            }
            None => respond(500, json!({"error": {"message": "the script ran out"}}).to_string()),
        };
        return (response, state.model_delay);
    } else if target.starts_with("/tools/big") {
        respond(200, "x".repeat(10_000))
    } else if target.starts_with("/tools/") {
        state.tool_calls.push(call);
        if let Some(location) = &state.tool_redirect {
            let response = Response::builder().status(302).header("location", location).body(Full::new(Bytes::new()));
            return (response, state.tool_delay);
        }
        return (respond(200, json!({"ok": true, "call": state.tool_calls.len()}).to_string()), state.tool_delay);
    } else {
        respond(404, "{}".into())
    };
    (response, std::time::Duration::ZERO)
}
