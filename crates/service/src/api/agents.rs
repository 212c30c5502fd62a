//! `GET /v1/agents/{agent}`: what a client needs to know of an agent
//! before acting on its runs (whether its approvals need a second person);
//! never its prompt, tools or provider.

use http::{Method, StatusCode};

use serde_json::{Value, json};

use super::openapi::{Parts, error_response, operation};
use super::query::no_query;
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse};
use agent_runs_agents::AgentRegistry;
use agent_runs_domain::Scope;

pub(super) async fn get(agents: &AgentRegistry, name: &str, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    match agents.about(name).await? {
        Some(about) => Ok(json_response(StatusCode::OK, &about)),
        None => Err(ApiError::NotFound("No such agent.".into())),
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::GetAgent,
    method: Method::GET,
    path: "/v1/agents/{agent}",
    operation_id: "getAgent",
    function: "directory",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(get(&api.agents, call.param("agent"), call.query())),
    },
    describe: Some(describe),
};

fn describe(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
        route.operation_id,
        "Get what a client may know of an agent",
        json!([{"name": "agent", "in": "path", "required": true, "schema": {"type": "string"}}]),
        None,
        json!({
            "200": {
                "description": "The agent's name, description and whether its approvals need another key than the run's creator.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Agent"}}}
            },
            "404": error_response("No agent of that name.", &[])
        }),
    )
}
