//! `GET /v1/agents/{agent}`: what a client needs to know of an agent
//! before acting on its runs (whether its approvals need a second person);
//! never its prompt, tools or provider.

use http::StatusCode;

use super::query::no_query;
use super::response::json_response;
use super::{ApiError, ApiResponse};
use agent_runs_agents::AgentRegistry;

pub(super) async fn get(agents: &AgentRegistry, name: &str, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    match agents.about(name).await? {
        Some(about) => Ok(json_response(StatusCode::OK, &about)),
        None => Err(ApiError::NotFound("No such agent.".into())),
    }
}
