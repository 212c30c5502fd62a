//! The route table: every operation of the contract, declared once. The
//! router of [`super::Api`], the local gateway's routing, the OpenAPI
//! document's paths and scopes, and (through `agent-runs template`)
//! `template.yaml`'s HTTP events and the `cargo lambda watch` router all
//! come from [`ROUTES`]. Adding an endpoint is one entry here, one module
//! under `api/` with its arm in the dispatch, its OpenAPI description, and
//! (when it gets its own Lambda function) one `functions/<function>` crate
//! and an entry of the function table; the tests name whatever was
//! forgotten.

use http::Method;

use agent_runs_domain::Scope;

/// The operations of the contract; each Lambda function serves one.
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
}

/// Where an operation lives and what serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub operation: Operation,
    pub method: Method,
    /// The path template, `{name}` for a parameter (API Gateway's syntax).
    pub path: &'static str,
    /// The OpenAPI `operationId`.
    pub operation_id: &'static str,
    /// The Lambda function (the `functions/<function>` crate and binary).
    pub function: &'static str,
    /// What the API key must be allowed to do.
    pub scope: Scope,
}

pub const ROUTES: [Route; 20] = [
    Route {
        operation: Operation::Create,
        method: Method::POST,
        path: "/v1/agent/runs",
        operation_id: "createRun",
        function: "create",
        scope: Scope::RunsWrite,
    },
    Route {
        operation: Operation::List,
        method: Method::GET,
        path: "/v1/agent/runs",
        operation_id: "listRuns",
        function: "list",
        scope: Scope::RunsRead,
    },
    Route {
        operation: Operation::Get,
        method: Method::GET,
        path: "/v1/agent/runs/{run_id}",
        operation_id: "getRun",
        function: "get",
        scope: Scope::RunsRead,
    },
    Route {
        operation: Operation::Cancel,
        method: Method::POST,
        path: "/v1/agent/runs/{run_id}/cancel",
        operation_id: "cancelRun",
        function: "cancel",
        scope: Scope::RunsWrite,
    },
    Route {
        operation: Operation::Decide,
        method: Method::POST,
        path: "/v1/agent/runs/{run_id}/approvals/{approval_id}",
        operation_id: "decideApproval",
        function: "decide",
        scope: Scope::ApprovalsDecide,
    },
    Route {
        operation: Operation::Extend,
        method: Method::POST,
        path: "/v1/agent/runs/{run_id}/approvals/{approval_id}/extend",
        operation_id: "extendApproval",
        function: "extend",
        scope: Scope::ApprovalsDecide,
    },
    Route {
        operation: Operation::Events,
        method: Method::GET,
        path: "/v1/agent/runs/{run_id}/events",
        operation_id: "listRunEvents",
        function: "events",
        scope: Scope::RunsRead,
    },
    Route {
        operation: Operation::Inbox,
        method: Method::GET,
        path: "/v1/approvals",
        operation_id: "listApprovals",
        function: "approvals",
        scope: Scope::ApprovalsDecide,
    },
    Route {
        operation: Operation::DecideBatch,
        method: Method::POST,
        path: "/v1/approvals/batch",
        operation_id: "decideApprovals",
        function: "decide-batch",
        scope: Scope::ApprovalsDecide,
    },
    Route {
        operation: Operation::CreateWebhook,
        method: Method::POST,
        path: "/v1/webhooks",
        operation_id: "createWebhook",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::ListWebhooks,
        method: Method::GET,
        path: "/v1/webhooks",
        operation_id: "listWebhooks",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::GetWebhook,
        method: Method::GET,
        path: "/v1/webhooks/{webhook_id}",
        operation_id: "getWebhook",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::DeleteWebhook,
        method: Method::DELETE,
        path: "/v1/webhooks/{webhook_id}",
        operation_id: "deleteWebhook",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::RotateWebhookSecret,
        method: Method::POST,
        path: "/v1/webhooks/{webhook_id}/rotate-secret",
        operation_id: "rotateWebhookSecret",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::ListWebhookDeliveries,
        method: Method::GET,
        path: "/v1/webhooks/{webhook_id}/deliveries",
        operation_id: "listWebhookDeliveries",
        function: "webhooks",
        scope: Scope::WebhooksManage,
    },
    Route {
        operation: Operation::GetPolicy,
        method: Method::GET,
        path: "/v1/policies",
        operation_id: "getPolicy",
        function: "policies",
        scope: Scope::RunsRead,
    },
    Route {
        operation: Operation::PutPolicy,
        method: Method::PUT,
        path: "/v1/policies",
        operation_id: "putPolicy",
        function: "policies",
        scope: Scope::PoliciesManage,
    },
    Route {
        operation: Operation::TestPolicy,
        method: Method::POST,
        path: "/v1/policies/test",
        operation_id: "testPolicy",
        function: "policies",
        scope: Scope::PoliciesManage,
    },
    Route {
        operation: Operation::ListKeys,
        method: Method::GET,
        path: "/v1/keys",
        operation_id: "listKeys",
        function: "directory",
        scope: Scope::RunsRead,
    },
    Route {
        operation: Operation::GetAgent,
        method: Method::GET,
        path: "/v1/agents/{agent}",
        operation_id: "getAgent",
        function: "directory",
        scope: Scope::RunsRead,
    },
];

/// The function behind API Gateway's `$default` route: no operation, only
/// the `404` and `405` answers.
pub const FALLBACK_FUNCTION: &str = "fallback";

impl Operation {
    pub fn route(self) -> &'static Route {
        ROUTES.iter().find(|route| route.operation == self).expect("every operation has a route")
    }
}

impl Route {
    /// API Gateway's route key, `POST /v1/agent/runs`.
    pub fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
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
    WrongMethod {
        allow: String,
    },
    NotFound,
}

pub fn resolve<'a>(method: &Method, path: &'a str) -> Resolved<'a> {
    let mut allowed = Vec::new();
    for route in &ROUTES {
        if let Some(params) = matches(route.path, path) {
            if route.method == method {
                return Resolved::Found(route, params);
            }
            allowed.push(route.method.as_str());
        }
    }
    if allowed.is_empty() {
        return Resolved::NotFound;
    }
    allowed.sort_unstable();
    Resolved::WrongMethod { allow: allowed.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_to_their_operation_and_parameters() {
        let Resolved::Found(route, params) = resolve(&Method::POST, "/v1/agent/runs/r1/approvals/a1") else {
            panic!("not found")
        };
        assert_eq!(route.operation, Operation::Decide);
        assert_eq!((params.get("run_id"), params.get("approval_id")), ("r1", "a1"));
        assert!(
            matches!(resolve(&Method::GET, "/v1/agent/runs"), Resolved::Found(route, _) if route.operation == Operation::List)
        );
        assert_eq!(resolve(&Method::DELETE, "/v1/agent/runs"), Resolved::WrongMethod { allow: "GET, POST".into() });
        assert_eq!(resolve(&Method::GET, "/v1/agent/runs/r1/cancel"), Resolved::WrongMethod { allow: "POST".into() });
        for missing in ["/v1/agent/runs/", "/v1/agent/runs//cancel", "/v1/agent/runs/r1/approvals/", "/v1/agent", "/x"]
        {
            assert_eq!(resolve(&Method::GET, missing), Resolved::NotFound, "{missing}");
            assert_eq!(resolve(&Method::POST, missing), Resolved::NotFound, "{missing}");
        }
    }

    #[test]
    fn each_operation_has_one_route_and_each_route_key_is_unique() {
        for route in &ROUTES {
            assert_eq!(route.operation.route(), route);
            assert_eq!(ROUTES.iter().filter(|other| other.key() == route.key()).count(), 1);
        }
    }
}
