//! `GET /.well-known/jwks.json`: the public keys approval receipts are
//! signed with (RFC 7517), to anyone: a tool checks receipts with them.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use serde_json::{Value, json};

use super::openapi::Parts;
use super::query::no_query;
use super::response::json_response;
use super::routes::{FALLBACK_FUNCTION, Handler, Operation, Route, always};
use super::{Api, ApiError, ApiResponse};
use agent_runs_ports::receipts::{JWKS_PATH, jwks};

pub(super) const ROUTE: Route = Route {
    operation: Operation::SigningKeys,
    method: Method::GET,
    path: JWKS_PATH,
    operation_id: "getSigningKeys",
    function: FALLBACK_FUNCTION,
    handler: Handler::Public { handle: |api, request| Box::pin(serve(api, request)), answers: always },
    describe: Some(describe),
};

async fn serve(api: &Api, request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let keys = match &api.signing_keys {
        Some(keys) => keys.keys().await.map_err(|error| ApiError::Unavailable(Box::new(error)))?,
        None => Vec::new(),
    };
    let mut response = json_response(http::StatusCode::OK, &jwks(&keys));
    // No key yet (on AWS, until the sweeper or a worker publishes it):
    // nothing for a cache to keep.
    let cache = if keys.is_empty() { "no-store" } else { "public, max-age=300" };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    Ok(response)
}

fn describe(route: &Route, _parts: &Parts<'_>) -> Value {
    let jwk = json!({
        "type": "object",
        "required": ["kty", "crv", "x", "y", "kid", "use", "alg"],
        "properties": {
            "kty": {"type": "string", "enum": ["EC"]},
            "crv": {"type": "string", "enum": ["P-256"]},
            "x": {"type": "string", "description": "base64url, 32 bytes"},
            "y": {"type": "string", "description": "base64url, 32 bytes"},
            "kid": {"type": "string", "description": "the key's RFC 7638 thumbprint"},
            "use": {"type": "string", "enum": ["sig"]},
            "alg": {"type": "string", "enum": ["ES256"]}
        }
    });
    json!({
        "operationId": route.operation_id,
        "summary": "The public keys approval receipts are signed with (RFC 7517)",
        "responses": {
            "200": {
                "description": "The key signing now first, then keys retired within the last 7 days. Cached for 5 minutes; an empty set is not cached.",
                "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["keys"],
                    "properties": {"keys": {"type": "array", "items": jwk}}
                }}}
            },
            "400": {"$ref": "#/components/responses/InvalidRequest"}
        }
    })
}
