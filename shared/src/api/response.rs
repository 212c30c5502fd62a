use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

pub type ApiResponse = Response<Bytes>;

pub fn json_response(status: StatusCode, body: &impl Serialize) -> ApiResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    json_bytes_response(status, Bytes::from(bytes))
}

/// A response whose body is already JSON.
pub fn json_bytes_response(status: StatusCode, bytes: Bytes) -> ApiResponse {
    let mut response = Response::new(bytes);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
