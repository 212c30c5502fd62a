//! The route table: every path the service answers, declared once, each
//! by the module that answers it (its path, scope or public-ness, handler
//! and OpenAPI description). The router of [`super::Api`], the local
//! gateway's routing, the OpenAPI document, and (through `agent-runs
//! template`) `template.yaml`'s HTTP events and the `cargo lambda watch`
//! router all come from [`ROUTES`]. Adding an endpoint is one module under
//! `api/` with its `ROUTE`, one line in [`ROUTES`] and an [`Operation`];
//! (when it gets its own Lambda function) one `functions/<function>` crate
//! and an entry of the function table. The tests name whatever was
//! forgotten.

use std::pin::Pin;

use bytes::Bytes;
use http::{Method, Request};
use serde_json::Value;

use super::openapi::Parts;
use super::{
    Api, ApiError, ApiResponse, agents, batch, cancel, console, create, decide, events, extend, get, inbox, jwks, keys,
    list, openapi, policies, webhooks,
};
use crate::auth::Principal;
use agent_runs_domain::{Owner, Scope};

/// What the service answers; each Lambda function serves one or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Create,
    List,
    Get,
    Cancel,
    Decide,
    Extend,
    Events,
    Inbox,
    DecideBatch,
    CreateWebhook,
    ListWebhooks,
    GetWebhook,
    DeleteWebhook,
    RotateWebhookSecret,
    ListWebhookDeliveries,
    GetPolicy,
    PutPolicy,
    TestPolicy,
    ListKeys,
    GetAgent,
    OpenApi,
    SigningKeys,
    /// The console's page, its files, and the addresses that lead to it.
    Console,
    ConsoleFile,
    ConsoleFromRoot,
    ConsoleFromFolder,
    Favicon,
}

/// Where an operation lives, who may call it and what answers it.
pub struct Route {
    pub operation: Operation,
    pub method: Method,
    /// The path template, `{name}` for a parameter (API Gateway's syntax).
    pub path: &'static str,
    /// The OpenAPI `operationId`.
    pub operation_id: &'static str,
    /// The Lambda function (the `functions/<function>` crate and binary);
    /// [`FALLBACK_FUNCTION`] for what API Gateway's `$default` route serves.
    pub function: &'static str,
    pub(crate) handler: Handler,
    /// Its OpenAPI operation; `None`: left out of the document (the console).
    pub(crate) describe: Option<Describe>,
}

/// What answers a route: an operation for a key with this scope, or a
/// page or document for anyone (read with GET or HEAD).
#[derive(Clone, Copy)]
pub(crate) enum Handler {
    Keyed {
        scope: Scope,
        handle: Keyed,
    },
    /// `answers`: whether the route is there for this path (a template's
    /// parameter may name a file that does not exist) and a request with a
    /// key or without. Where it is not, the path is as unknown as any.
    Public {
        handle: Public,
        answers: Answers,
    },
}

/// A request to a keyed route, as the router passed it on: the caller,
/// the path's parameters, the request.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    pub by: &'a Principal,
    pub params: &'a PathParams<'a>,
    pub request: &'a Request<Bytes>,
}

impl<'a> Call<'a> {
    pub fn owner(&self) -> &'a Owner {
        &self.by.owner
    }

    pub fn param(&self, name: &str) -> &'a str {
        self.params.get(name)
    }

    pub fn query(&self) -> Option<&'a str> {
        self.request.uri().query()
    }
}

/// An operation's answer, boxed: held inline, every request's future would
/// be as large as the largest operation's, and moved whole (several KB) at
/// each step up to the connection.
pub(crate) type Handled<'a> = Pin<Box<dyn Future<Output = Result<ApiResponse, ApiError>> + Send + 'a>>;
pub(crate) type Keyed = for<'a> fn(&'a Api, Call<'a>) -> Handled<'a>;
pub(crate) type Public = for<'a> fn(&'a Api, &'a Request<Bytes>) -> Handled<'a>;
pub(crate) type Answers = fn(path: &str, with_key: bool) -> bool;
pub(crate) type Describe = fn(&Route, &Parts<'_>) -> Value;

/// Every route, in the order the OpenAPI document lists them.
pub static ROUTES: [Route; 27] = [
    create::ROUTE,
    list::ROUTE,
    get::ROUTE,
    cancel::ROUTE,
    decide::ROUTE,
    extend::ROUTE,
    events::ROUTE,
    inbox::ROUTE,
    batch::ROUTE,
    webhooks::CREATE,
    webhooks::LIST,
    webhooks::GET,
    webhooks::DELETE,
    webhooks::ROTATE_SECRET,
    webhooks::DELIVERIES,
    policies::GET,
    policies::PUT,
    policies::TEST,
    keys::ROUTE,
    agents::ROUTE,
    openapi::ROUTE,
    jwks::ROUTE,
    console::PAGE,
    console::FILE,
    console::FAVICON,
    console::FROM_ROOT,
    console::FROM_FOLDER,
];

/// The function behind API Gateway's `$default` route: the console and the
/// documents anyone may read, and the `404` and `405` answers.
pub const FALLBACK_FUNCTION: &str = "fallback";

impl Operation {
    pub fn route(self) -> &'static Route {
        ROUTES.iter().find(|route| route.operation == self).expect("every operation has a route")
    }
}

impl PartialEq for Route {
    fn eq(&self, other: &Route) -> bool {
        self.operation == other.operation
    }
}

impl Eq for Route {}

impl std::fmt::Debug for Route {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{:?} ({})", self.operation, self.key())
    }
}

impl Route {
    /// API Gateway's route key, `POST /v1/agent/runs`.
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// The scope a key needs; `None`: anyone may read it, without a key.
    pub fn scope(&self) -> Option<Scope> {
        match self.handler {
            Handler::Keyed { scope, .. } => Some(scope),
            Handler::Public { .. } => None,
        }
    }

    /// Whether API Gateway routes it to its function by its route key (the
    /// rest reach the fallback function through `$default`).
    pub fn has_gateway_route(&self) -> bool {
        self.function != FALLBACK_FUNCTION
    }
}

/// The path parameters of a matched route, by name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PathParams<'a>(Vec<(&'static str, &'a str)>);

impl<'a> PathParams<'a> {
    /// The parameter's value; an empty string for a name the route lacks
    /// (which no handler asks for: the route table and handlers agree).
    pub fn get(&self, name: &str) -> &'a str {
        self.0.iter().find(|(key, _)| *key == name).map_or("", |(_, value)| value)
    }
}

/// Matches `path` against a template: same number of segments, literal
/// segments equal, each `{name}` one non-empty segment.
fn matches<'a>(template: &'static str, path: &'a str) -> Option<PathParams<'a>> {
    let mut params = Vec::new();
    let mut segments = path.split('/');
    for expected in template.split('/') {
        let segment = segments.next()?;
        match expected.strip_prefix('{').and_then(|name| name.strip_suffix('}')) {
            Some(name) if !segment.is_empty() => params.push((name, segment)),
            Some(_) => return None,
            None if expected == segment => {}
            None => return None,
        }
    }
    segments.next().is_none().then_some(PathParams(params))
}

/// What a request's method and path name.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved<'a> {
    Found(&'static Route, PathParams<'a>),
    /// The path exists, but not with this method: these are allowed.
    /// `public`: anyone may learn that, without a key.
    WrongMethod {
        allow: String,
        public: bool,
    },
    NotFound,
}

/// For a public route whose path is all literal, and asked of anyone.
pub(crate) fn always(_path: &str, _with_key: bool) -> bool {
    true
}

/// The route `method` and `path` name for a request `with_key` (an
/// `Authorization` header) or without. A public route is read with GET or
/// HEAD (the HTTP layer sends a HEAD's headers alone).
pub fn resolve<'a>(method: &Method, path: &'a str, with_key: bool) -> Resolved<'a> {
    let mut allowed = Vec::new();
    let mut public = false;
    for route in &ROUTES {
        if let Handler::Public { answers, .. } = route.handler
            && !answers(path, with_key)
        {
            continue;
        }
        if let Some(params) = matches(route.path, path) {
            let head_of_get = route.scope().is_none() && method == Method::HEAD && route.method == Method::GET;
            if route.method == method || head_of_get {
                return Resolved::Found(route, params);
            }
            public |= route.scope().is_none();
            allowed.push(route.method.as_str());
        }
    }
    if allowed.is_empty() {
        return Resolved::NotFound;
    }
    if public {
        allowed.push(Method::HEAD.as_str());
    }
    allowed.sort_unstable();
    Resolved::WrongMethod { allow: allowed.join(", "), public }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_to_their_operation_and_parameters() {
        let Resolved::Found(route, params) = resolve(&Method::POST, "/v1/agent/runs/r1/approvals/a1", true) else {
            panic!("not found")
        };
        assert_eq!(route.operation, Operation::Decide);
        assert_eq!((params.get("run_id"), params.get("approval_id")), ("r1", "a1"));
        assert!(
            matches!(resolve(&Method::GET, "/v1/agent/runs", true), Resolved::Found(route, _) if route.operation == Operation::List)
        );
        assert_eq!(
            resolve(&Method::DELETE, "/v1/agent/runs", true),
            Resolved::WrongMethod { allow: "GET, POST".into(), public: false }
        );
        assert_eq!(
            resolve(&Method::GET, "/v1/agent/runs/r1/cancel", true),
            Resolved::WrongMethod { allow: "POST".into(), public: false }
        );
        for missing in ["/v1/agent/runs/", "/v1/agent/runs//cancel", "/v1/agent/runs/r1/approvals/", "/v1/agent", "/x"]
        {
            assert_eq!(resolve(&Method::GET, missing, true), Resolved::NotFound, "{missing}");
            assert_eq!(resolve(&Method::POST, missing, false), Resolved::NotFound, "{missing}");
        }
    }

    #[test]
    fn the_console_and_documents_are_read_by_anyone_with_get_or_head() {
        for (method, path, operation) in [
            (Method::GET, "/console", Operation::Console),
            (Method::HEAD, "/console/console.js", Operation::ConsoleFile),
            (Method::GET, "/", Operation::ConsoleFromRoot),
            (Method::GET, "/console/", Operation::ConsoleFromFolder),
            (Method::HEAD, "/v1/openapi.json", Operation::OpenApi),
            (Method::GET, "/.well-known/jwks.json", Operation::SigningKeys),
        ] {
            let Resolved::Found(route, _) = resolve(&method, path, false) else { panic!("{method} {path}") };
            assert_eq!((route.operation, route.scope()), (operation, None), "{method} {path}");
            assert!(!route.has_gateway_route(), "served through $default");
        }
        let public = Resolved::WrongMethod { allow: "GET, HEAD".into(), public: true };
        assert_eq!(resolve(&Method::POST, "/console", false), public);
        assert_eq!(resolve(&Method::POST, "/console/console.js", true), public);
        assert_eq!(resolve(&Method::DELETE, "/.well-known/jwks.json", true), public);
        // A file the console does not have, or the root asked with a key, is
        // as unknown as any path: the caller's key is checked first.
        for (path, with_key) in [("/console/nope.js", false), ("/console/favicon.ico", true), ("/", true)] {
            assert_eq!(resolve(&Method::GET, path, with_key), Resolved::NotFound, "{path}");
            assert_eq!(resolve(&Method::POST, path, with_key), Resolved::NotFound, "{path}");
        }
        assert_eq!(resolve(&Method::POST, "/", false), public);
        // A keyed operation is not read with HEAD.
        let keys = Resolved::WrongMethod { allow: "GET".into(), public: false };
        assert_eq!(resolve(&Method::HEAD, "/v1/keys", true), keys);
    }

    /// The contract's reference names every path of the OpenAPI document
    /// (a parameter by any name: `{id}` for `{webhook_id}`).
    #[test]
    fn docs_api_md_names_every_documented_path() {
        fn unnamed(text: &str) -> String {
            let mut out = String::with_capacity(text.len());
            let mut in_name = false;
            for c in text.chars() {
                match c {
                    '{' => {
                        in_name = true;
                        out.push_str("{}");
                    }
                    '}' => in_name = false,
                    c if !in_name => out.push(c),
                    _ => {}
                }
            }
            out
        }
        let reference = unnamed(include_str!("../../../../docs/api.md"));
        for route in ROUTES.iter().filter(|route| route.describe.is_some()) {
            assert!(reference.contains(&unnamed(route.path)), "docs/api.md does not name {}", route.key());
        }
    }

    #[test]
    fn each_operation_has_one_route_and_each_route_key_is_unique() {
        for route in &ROUTES {
            assert!(std::ptr::eq(route.operation.route(), route), "{route:?}");
            assert_eq!(ROUTES.iter().filter(|other| other.operation == route.operation).count(), 1, "{route:?}");
            assert_eq!(ROUTES.iter().filter(|other| other.key() == route.key()).count(), 1, "{route:?}");
        }
    }
}
