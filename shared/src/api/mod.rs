//! HTTP in, HTTP out: one module per operation, the router, and the shell
//! every request passes through (request id, authentication, rate limit,
//! errors). Framework-neutral: `http::Request<Bytes>` to
//! `http::Response<Bytes>`, so the same code serves Lambda and the embedded
//! server.

mod body;
mod cancel;
mod create;
mod decide;
mod error;
mod get;
mod list;
pub mod openapi;
mod rate_limit;
mod response;
mod views;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};

pub use body::MAX_BODY_BYTES;
pub use error::ApiError;
pub use rate_limit::RateLimit;
pub use response::ApiResponse;

use crate::agents::AgentRegistry;
use crate::auth::{AuthError, Authenticator, Principal, bearer_token};
use crate::domain::{Clock, ExecutionPolicy, IdGenerator, Run, RunId};
use crate::error_chain;
use crate::queue::RunQueue;
use crate::store::{RunStore, StoreError};
use rate_limit::RateLimiter;

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

/// Limits on what one owner may do.
#[derive(Debug, Clone)]
pub struct ApiLimits {
    pub max_active_runs: u32,
    pub rate: RateLimit,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self { max_active_runs: 1_000, rate: RateLimit::default() }
    }
}

/// Everything the operations need, built once per process.
pub struct Api {
    runs: Arc<dyn RunStore>,
    queue: Arc<dyn RunQueue>,
    auth: Authenticator,
    agents: AgentRegistry,
    clock: Arc<dyn Clock>,
    ids: IdGenerator,
    policy: ExecutionPolicy,
    limits: ApiLimits,
    rate_limiter: RateLimiter,
    openapi: Bytes,
}

/// The operations, found from method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route<'a> {
    Runs,
    Run(&'a str),
    Cancel(&'a str),
    Decide(&'a str, &'a str),
}

impl Route<'_> {
    fn parse(path: &str) -> Option<Route<'_>> {
        let rest = path.strip_prefix("/v1/agent/runs")?;
        if rest.is_empty() {
            return Some(Route::Runs);
        }
        let segments: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
        match segments.as_slice() {
            [run] if !run.is_empty() => Some(Route::Run(run)),
            [run, "cancel"] if !run.is_empty() => Some(Route::Cancel(run)),
            [run, "approvals", approval] if !run.is_empty() && !approval.is_empty() => {
                Some(Route::Decide(run, approval))
            }
            _ => None,
        }
    }

    fn allow(&self) -> &'static str {
        match self {
            Route::Runs => "GET, POST",
            Route::Run(_) => "GET",
            Route::Cancel(_) | Route::Decide(..) => "POST",
        }
    }
}

impl Api {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        runs: Arc<dyn RunStore>,
        queue: Arc<dyn RunQueue>,
        auth: Authenticator,
        agents: AgentRegistry,
        clock: Arc<dyn Clock>,
        policy: ExecutionPolicy,
        limits: ApiLimits,
    ) -> Self {
        let rate_limiter = RateLimiter::new(limits.rate);
        let document = openapi::document(&agents.names_list(), agents.default_name());
        let openapi = Bytes::from(serde_json::to_vec(&document).unwrap_or_default());
        Api { runs, queue, auth, agents, clock, ids: IdGenerator::default(), policy, limits, rate_limiter, openapi }
    }

    /// Answers one request, of any operation. Never fails: every error
    /// becomes its response.
    pub async fn handle(&self, request: Request<Bytes>) -> ApiResponse {
        self.answer(Serving::All, request).await
    }

    /// Answers a request that must be for `operation` (a Lambda function
    /// serves one); any other path or method is a `404` or `405`, never
    /// another operation. `None` is API Gateway's `$default` route, which
    /// serves no operation: only the `404` and `405` answers.
    pub async fn handle_as(&self, operation: Option<Operation>, request: Request<Bytes>) -> ApiResponse {
        self.answer(operation.map_or(Serving::Nothing, Serving::One), request).await
    }

    async fn answer(&self, serving: Serving, request: Request<Bytes>) -> ApiResponse {
        let request_id = request
            .extensions()
            .get::<RequestId>()
            .map(|id| id.0.clone())
            .unwrap_or_else(|| self.ids.ulid_at(self.clock.now()).to_string());
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let mut response = match self.dispatch(serving, request).await {
            Ok(response) => response,
            Err(error) => {
                match &error {
                    ApiError::Internal(_) | ApiError::Unavailable(_) => tracing::error!(
                        request_id = %request_id, %method, %path,
                        error = %error_chain(&error), "request failed"
                    ),
                    _ => {
                        tracing::debug!(request_id = %request_id, %method, %path, code = error.code(), "request refused")
                    }
                }
                error.into_response()
            }
        };
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            response.headers_mut().insert("x-request-id", value);
        }
        response
    }

    async fn dispatch(&self, serving: Serving, request: Request<Bytes>) -> Result<ApiResponse, ApiError> {
        if request.uri().path() == openapi::PATH {
            // The API's description needs no key.
            if request.method() != Method::GET {
                return Err(ApiError::MethodNotAllowed { allow: "GET" });
            }
            let mut response = http::Response::new(self.openapi.clone());
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            return Ok(response);
        }
        let principal = self.authenticate(&request).await?;
        self.rate_limiter.check(&principal.owner, self.clock.now())?;
        let route = Route::parse(request.uri().path()).ok_or_else(not_found_path)?;
        let operation = match (&route, request.method()) {
            (Route::Runs, &Method::POST) => Operation::Create,
            (Route::Runs, &Method::GET) => Operation::List,
            (Route::Run(_), &Method::GET) => Operation::Get,
            (Route::Cancel(_), &Method::POST) => Operation::Cancel,
            (Route::Decide(..), &Method::POST) => Operation::Decide,
            _ => return Err(ApiError::MethodNotAllowed { allow: route.allow() }),
        };
        let served = match serving {
            Serving::All => true,
            Serving::One(expected) => expected == operation,
            Serving::Nothing => false,
        };
        if !served {
            return Err(not_found_path());
        }
        if request.extensions().get::<BodyTooLarge>().is_some() || request.body().len() > MAX_BODY_BYTES {
            return Err(ApiError::RequestTooLarge);
        }
        if request.extensions().get::<BodyTimedOut>().is_some() {
            return Err(ApiError::RequestTimeout);
        }
        let owner = &principal.owner;
        match route {
            Route::Runs if operation == Operation::Create => create::handle(self, owner, &request).await,
            Route::Runs => list::handle(self.runs.as_ref(), owner, request.uri().query()).await,
            Route::Run(run_id) => get::handle(self.runs.as_ref(), owner, run_id).await,
            Route::Cancel(run_id) => {
                cancel::handle(self.runs.as_ref(), self.clock.as_ref(), owner, run_id, &request).await
            }
            Route::Decide(run_id, approval_id) => decide::handle(self, owner, run_id, approval_id, &request).await,
        }
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
    /// The `$default` route: `404` and `405` only.
    Nothing,
}

/// The operations of the contract; each Lambda function serves one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    List,
    Get,
    Cancel,
    Decide,
}

fn not_found_path() -> ApiError {
    ApiError::NotFound("No such path. Operations live under /v1/agent/runs.".into())
}

/// A run id from a path; a malformed one names no run, so it is a `404`.
fn parse_run_id(text: &str) -> Result<RunId, ApiError> {
    text.parse().map_err(|_| ApiError::run_not_found())
}

/// Reads the run, applies `change` and writes it back, again from a fresh
/// read when another writer came first. `change` returns whether it changed
/// anything; an unchanged run is not written.
async fn modify_run<T>(
    runs: &dyn RunStore,
    owner: &crate::domain::Owner,
    run_id: RunId,
    mut change: impl FnMut(&mut Run) -> Result<(T, bool), ApiError>,
) -> Result<(Run, T), ApiError> {
    const ATTEMPTS: usize = 16;
    for _ in 0..ATTEMPTS {
        let mut run = runs.get(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
        let (outcome, changed) = change(&mut run)?;
        if !changed {
            return Ok((run, outcome));
        }
        match runs.update(&mut run).await {
            Ok(()) => return Ok((run, outcome)),
            Err(StoreError::Conflict) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(ApiError::Unavailable("the run kept changing under concurrent writes".into()))
}

fn run_response(status: http::StatusCode, run: &Run) -> ApiResponse {
    response::json_response(status, &views::RunView::from(run))
}
