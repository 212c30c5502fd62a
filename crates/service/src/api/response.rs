use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

pub type ApiResponse = Response<Bytes>;

pub fn json_response(status: StatusCode, body: &impl Serialize) -> ApiResponse {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    json_bytes_response(status, Bytes::from(bytes))
}

/// `{"data": [<each item's JSON>], "next_cursor": ...}`, the items spliced
/// in as the store gave them.
pub fn page_response(views: &[std::sync::Arc<str>], next_cursor: Option<String>) -> ApiResponse {
    let mut body = String::with_capacity(views.iter().map(|view| view.len() + 1).sum::<usize>() + 64);
    body.push_str("{\"data\":[");
    for (index, view) in views.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push_str(view);
    }
    body.push_str("],\"next_cursor\":");
    body.push_str(&serde_json::to_string(&next_cursor).unwrap_or_else(|_| "null".to_owned()));
    body.push('}');
    json_bytes_response(StatusCode::OK, body.into())
}

/// A response whose body is already JSON.
pub fn json_bytes_response(status: StatusCode, bytes: Bytes) -> ApiResponse {
    let mut response = Response::new(bytes);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
