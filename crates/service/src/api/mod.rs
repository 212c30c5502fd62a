//! HTTP in, HTTP out: one module per operation, the router, and the shell
//! every request passes through (request id, authentication, rate limit,
//! errors). Framework-neutral: `http::Request<Bytes>` to
//! `http::Response<Bytes>`, so the same code serves Lambda and the embedded
//! server.

// A route written but left out of the route table is an error, not a warning.
#![deny(dead_code)]

mod agents;
mod batch;
mod body;
mod cancel;
mod console;
mod create;
mod decide;
mod error;
mod events;
mod extend;
mod get;
mod holds;
mod inbox;
mod jwks;
mod keys;
mod list;
pub mod openapi;
mod policies;
mod query;
mod rate_limit;
mod response;
pub mod routes;
mod webhooks;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use tracing::Instrument;

pub use body::MAX_BODY_BYTES;
pub use error::ApiError;
pub use events::{CanStream, EventStream, MAX_WAIT_SECS, asks_for_event_stream};
pub use holds::HoldLimits;
pub use rate_limit::RateLimit;
pub use response::ApiResponse;
pub use routes::{Operation, ROUTES};

use crate::auth::{AuthError, Authenticator, Principal, bearer_token};
use crate::commands::RunCommands;
use agent_runs_agents::AgentRegistry;
use agent_runs_domain::{Clock, ExecutionPolicy, IdGenerator, Run, RunId, RunTrace, SpanParent};
use agent_runs_platform::telemetry::{self, SpanKind};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::RunQueue;
use agent_runs_ports::receipts::PublishedKeys;
use agent_runs_ports::store::{PolicyStore, Store, WebhookStore};
use agent_runs_ports::views::ExtraFields;
use rate_limit::RateLimiter;
use routes::{Call, Handler, Resolved};

/// The request id every response carries in `x-request-id`; set by whatever
/// serves the request (API Gateway's id on AWS, a generated one locally).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Set by the server when the body was longer than [`MAX_BODY_BYTES`] and was
/// not read whole.
#[derive(Debug, Clone, Copy)]
pub struct BodyTooLarge;

/// Set by the server when the body did not arrive in the time it allows;
/// the request is answered `408 request_timeout`.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimedOut;

/// Set by the server when the connection ended before the body's declared
/// length arrived; the request is answered `400` and changes nothing.
#[derive(Debug, Clone, Copy)]
pub struct BodyCutShort;

/// Limits on what one owner may do.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    pub max_active_runs: u32,
    pub rate: RateLimit,
    /// Event streams and long-polls.
    pub holds: HoldLimits,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            max_active_runs: agent_runs_ports::store::DEFAULT_MAX_ACTIVE_RUNS,
            rate: RateLimit::default(),
            holds: HoldLimits::default(),
        }
    }
}

/// Everything the operations need, built once per process.
pub struct Api {
    runs: Arc<dyn Store>,
    commands: RunCommands,
    auth: Authenticator,
    agents: AgentRegistry,
    clock: Arc<dyn Clock>,
    ids: IdGenerator,
    rate_limiter: RateLimiter,
    holds: Arc<holds::Holds>,
    openapi: Bytes,
    webhooks: Arc<dyn WebhookStore>,
    webhook_allow_private: bool,
    /// What runs show beyond the contract's keys.
    shown: ExtraFields,
    policies: Arc<dyn PolicyStore>,
    /// The keys approval receipts are signed with, for the JWKS.
    signing_keys: Option<Arc<dyn PublishedKeys>>,
}

/// What [`Api`] is made of; [`crate::services::Services::api`] builds it.
pub struct ApiParts {
    pub runs: Arc<dyn Store>,
    pub queue: Arc<dyn RunQueue>,
    pub auth: Authenticator,
    pub agents: AgentRegistry,
    pub clock: Arc<dyn Clock>,
    pub policy: ExecutionPolicy,
    pub limits: ApiLimits,
    pub webhooks: Arc<dyn WebhookStore>,
    /// Webhook URLs may be `http` and private addresses.
    pub webhook_allow_private: bool,
    /// What runs show beyond the contract's keys.
    pub shown: ExtraFields,
    pub policies: Arc<dyn PolicyStore>,
}

impl Api {
    pub fn new(parts: ApiParts) -> Self {
        let ApiParts {
            runs,
            queue,
            auth,
            agents,
            clock,
            policy,
            limits,
            webhooks,
            webhook_allow_private,
            shown,
            policies,
        } = parts;
        let rate_limiter = RateLimiter::new(limits.rate);
        let document = openapi::document(&agents.names_list(), agents.default_name());
        let openapi = Bytes::from(serde_json::to_vec(&document).unwrap_or_default());
        let commands =
            RunCommands::new(runs.clone(), queue, agents.clone(), clock.clone(), policy, limits.max_active_runs);
        Api {
            runs,
            commands,
            auth,
            agents,
            clock,
            ids: IdGenerator::default(),
            rate_limiter,
            holds: holds::Holds::new(limits.holds),
            openapi,
            webhooks,
            webhook_allow_private,
            shown,
            policies,
            signing_keys: None,
        }
    }

    /// Serves these keys at the JWKS path (an empty set without).
    pub fn with_signing_keys(mut self, keys: Arc<dyn PublishedKeys>) -> Self {
        self.signing_keys = Some(keys);
        self
    }

    /// Answers one request, of any operation. Never fails: every error
    /// becomes its response.
    pub async fn handle(&self, request: Request<Bytes>) -> ApiResponse {
        self.answer(Serving::All, request).await
    }

    /// Answers a request that must be for `operation` or another of its
    /// function's (a Lambda function serves those); any other path or
    /// method is a `404` or `405`, never another function's operation. `None` is API Gateway's `$default` route, which
    /// serves no operation: only the `404` and `405` answers.
    pub async fn handle_as(&self, operation: Option<Operation>, request: Request<Bytes>) -> ApiResponse {
        self.answer(operation.map_or(Serving::Fallback, Serving::One), request).await
    }

    async fn answer(&self, serving: Serving, mut request: Request<Bytes>) -> ApiResponse {
        let request_id = request
            .extensions()
            .get::<RequestId>()
            .map(|id| id.0.clone())
            .unwrap_or_else(|| self.ids.ulid_at(self.clock.now()).to_string());
        let caller = telemetry::traceparent(request.headers());
        let (trace, caller_span) = telemetry::request_span_ids(caller);
        request.extensions_mut().insert(RequestTrace(trace));
        // Whether it is kept is decided at the end: a change to a run follows
        // the sampling of the run's trace.
        let mut request_span = telemetry::enabled()
            .then(|| {
                let with_key = request.headers().contains_key(header::AUTHORIZATION);
                let name = request_span_name(request.method(), request.uri().path(), with_key);
                telemetry::Span::with_id(trace.trace_id, trace.span_id, caller_span, true, name, SpanKind::Server)
            })
            .flatten();
        if let Some(span) = &mut request_span {
            span.set("http.request.method", request.method().to_string());
            span.set("url.path", request.uri().path().to_owned());
            span.set("agent_runs.request_id", request_id.clone());
        }
        // Every line logged while answering carries these; the owner and
        // run are filled in once known.
        let span = tracing::info_span!(
            "request",
            request_id = %request_id,
            method = %request.method(),
            path = %request.uri().path(),
            owner = tracing::field::Empty,
            run_id = tracing::field::Empty,
            trace_id = %format_args!("{:032x}", trace.trace_id),
        );
        let mut response = match self.dispatch(serving, request).instrument(span.clone()).await {
            Ok(response) => response,
            Err(error) => {
                span.in_scope(|| match &error {
                    ApiError::Internal(_) | ApiError::Unavailable(_) => {
                        tracing::error!(error = %error_chain(&error), "request failed")
                    }
                    _ => tracing::debug!(code = error.code(), "request refused"),
                });
                error.into_response()
            }
        };
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert("x-request-id", value);
        }
        // Requests without a valid key make no spans: they are nobody's.
        let request_span = request_span.filter(|_| response.status() != http::StatusCode::UNAUTHORIZED);
        // A change to a run is a span of the run's trace, unless the caller
        // traces it in a trace of its own.
        let request_span = match (caller_span, response.extensions().get::<RunTrace>()) {
            (None, Some(run)) => request_span.and_then(|span| span.in_trace(run.as_parent())),
            _ => request_span.filter(|_| trace.sampled),
        };
        if let Some(mut span) = request_span {
            let status = response.status();
            span.set("http.response.status_code", i64::from(status.as_u16()));
            if status.is_server_error() {
                span.fail("server_error", status.as_str().to_owned());
            }
            span.end();
        }
        response
    }

    async fn dispatch(&self, serving: Serving, request: Request<Bytes>) -> Result<ApiResponse, ApiError> {
        let with_key = request.headers().contains_key(header::AUTHORIZATION);
        let (route, params) = match routes::resolve(request.method(), request.uri().path(), with_key) {
            Resolved::Found(route, params) => (route, params),
            // Anyone may learn which methods the console and documents take.
            Resolved::WrongMethod { allow, public: true } => return Err(ApiError::MethodNotAllowed { allow }),
            // Only a caller with a key learns what else exists.
            Resolved::WrongMethod { allow, public: false } => {
                self.caller(&request).await?;
                return Err(ApiError::MethodNotAllowed { allow });
            }
            Resolved::NotFound => {
                self.caller(&request).await?;
                return Err(not_found_path());
            }
        };
        let (scope, handle) = match route.handler {
            // The console and the documents need no key: every function
            // serves them, as the person or the tool reading them asks.
            Handler::Public { handle, .. } => return handle(self, &request).await,
            Handler::Keyed { scope, handle } => (scope, handle),
        };
        let principal = self.caller(&request).await?;
        let served = match serving {
            Serving::All => true,
            Serving::One(expected) => expected.route().function == route.function,
            Serving::Fallback => false,
        };
        if !served {
            return Err(not_found_path());
        }
        if !principal.scopes.allows(scope) {
            return Err(ApiError::Forbidden(format!(
                "This API key lacks the scope `{}` that this operation needs.",
                scope.as_str()
            )));
        }
        if request.extensions().get::<BodyTooLarge>().is_some() || request.body().len() > MAX_BODY_BYTES {
            return Err(ApiError::RequestTooLarge);
        }
        if request.extensions().get::<BodyTimedOut>().is_some() {
            return Err(ApiError::RequestTimeout);
        }
        if request.extensions().get::<BodyCutShort>().is_some() {
            return Err(ApiError::invalid(
                None,
                "The request body ended before the length its Content-Length header declares. Send the whole body.",
            ));
        }
        let run_id = params.get("run_id");
        if !run_id.is_empty() {
            tracing::Span::current().record("run_id", tracing::field::display(run_id));
        }
        handle(self, Call { by: &principal, params: &params, request: &request }).await
    }

    /// Who is calling (their key, verified), within their rate limit.
    async fn caller(&self, request: &Request<Bytes>) -> Result<Principal, ApiError> {
        let principal = self.authenticate(request).await?;
        tracing::Span::current().record("owner", tracing::field::display(&principal.owner));
        self.rate_limiter.check(&principal.owner, self.clock.now())?;
        Ok(principal)
    }

    /// The request's key, to be checked again while the request is held.
    fn key_check(&self, request: &Request<Bytes>) -> Option<holds::KeyCheck> {
        let value = request.headers().get(header::AUTHORIZATION)?;
        bearer_token(value.as_bytes()).map(|secret| holds::KeyCheck::new(&self.auth, secret))
    }

    async fn authenticate(&self, request: &Request<Bytes>) -> Result<Principal, ApiError> {
        let mut headers = request.headers().get_all(header::AUTHORIZATION).iter();
        let (Some(value), None) = (headers.next(), headers.next()) else {
            return Err(ApiError::Unauthorized);
        };
        let secret = bearer_token(value.as_bytes()).ok_or(ApiError::Unauthorized)?;
        self.auth.authenticate(secret).await.map_err(|error| match error {
            AuthError::Unauthorized => ApiError::Unauthorized,
            AuthError::Store(store) => store.into(),
        })
    }
}

/// Which operations a process answers.
#[derive(Debug, Clone, Copy)]
enum Serving {
    All,
    One(Operation),
    /// API Gateway's `$default` route: the public routes (the console,
    /// the documents), `404` and `405`, and no keyed operation.
    Fallback,
}

fn not_found_path() -> ApiError {
    ApiError::NotFound(
        "No such path. Operations live under /v1/agent/runs, /v1/approvals, /v1/webhooks, /v1/policies, /v1/keys and /v1/agents; the console is at /console."
            .into(),
    )
}

/// A run id from a path; a malformed one names no run, so it is a `404`.
fn parse_run_id(text: &str) -> Result<RunId, ApiError> {
    text.parse().map_err(|_| ApiError::run_not_found())
}

/// A run id a body field or query parameter `param` holds; a malformed one
/// is a `400` naming it.
fn run_id_of(param: &'static str, text: &str) -> Result<RunId, ApiError> {
    text.parse()
        .map_err(|_| ApiError::invalid(param, format!("`{param}` must be a run id (run_ followed by 26 characters).")))
}

fn run_response(status: http::StatusCode, run: &Run, shown: ExtraFields) -> ApiResponse {
    response::json_response(status, &agent_runs_ports::views::RunView::new(run, shown))
}

/// The run a request changed: its span joins the run's trace.
fn changed_run_response(run: &Run, shown: ExtraFields) -> ApiResponse {
    let mut response = run_response(http::StatusCode::OK, run, shown);
    response.extensions_mut().insert(run.trace());
    response
}

/// The trace of the request being answered (a run it creates is its child).
#[derive(Debug, Clone, Copy)]
pub struct RequestTrace(pub SpanParent);

/// `GET /v1/agent/runs/{run_id}`: the method and the matched route's
/// template, so that all requests of an operation share one name.
fn request_span_name(method: &Method, path: &str, with_key: bool) -> String {
    match routes::resolve(method, path, with_key) {
        Resolved::Found(route, _) => format!("{method} {}", route.path),
        _ => method.to_string(),
    }
}
