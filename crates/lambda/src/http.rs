use std::convert::Infallible;

use bytes::Bytes;
use lambda_http::request::RequestContext;
use lambda_http::{Body, RequestExt, service_fn};

use crate::aws_services::AwsServices;
use agent_runs_service::api::{ApiResponse, Operation, RequestId};

/// An API Gateway request as the shared operations take it, with API
/// Gateway's request id as the response's `x-request-id`.
pub fn into_api_request(request: lambda_http::Request) -> http::Request<Bytes> {
    let request_id = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) => context.request_id.clone(),
        _ => None,
    };
    let (mut parts, body) = request.into_parts();
    if let Some(id) = request_id {
        parts.extensions.insert(RequestId(id));
    }
    let bytes = match body {
        Body::Empty => Bytes::new(),
        Body::Text(text) => Bytes::from(text),
        Body::Binary(bytes) => Bytes::from(bytes),
        _ => Bytes::new(),
    };
    http::Request::from_parts(parts, bytes)
}

/// JSON goes back as text, so API Gateway passes it through unencoded.
pub fn from_api_response(response: ApiResponse) -> lambda_http::Response<Body> {
    response.map(|bytes| match String::from_utf8(bytes.to_vec()) {
        Ok(text) => Body::Text(text),
        Err(error) => Body::Binary(error.into_bytes()),
    })
}

/// Serves one operation (`None`: the `$default` route's 404/405 fallback).
pub async fn run_http(operation: Option<Operation>) -> Result<(), super::Error> {
    super::init_logging();
    let aws = AwsServices::from_env().await?;
    aws.warm_up();
    let api = aws.services.api();
    let api = &api;
    lambda_http::run(service_fn(move |request: lambda_http::Request| async move {
        let deadline = request.lambda_context_ref().map(|context| context.deadline());
        let response = api.handle_as(operation, into_api_request(request)).await;
        // Spans go out before the function may be frozen.
        agent_runs_platform::telemetry::flush(deadline).await;
        Ok::<_, Infallible>(from_api_response(response))
    }))
    .await
}
