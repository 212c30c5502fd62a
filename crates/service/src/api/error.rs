//! The error every operation answers with, and its HTTP form:
//! `{"error": {"code": ..., "message": ..., "param": ...}}`.

use http::{HeaderValue, StatusCode, header};

use super::response::{ApiResponse, json_response};
use agent_runs_ports::queue::QueueError;
use agent_runs_ports::store::StoreError;

/// Seconds a client should wait before retrying after a `503`.
const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<String> },
    /// What is wrong with one element of a list in the body (a policy's
    /// rule): `error.index` names it.
    #[error("{message}")]
    InvalidRule { index: usize, param: String, message: String },
    #[error("unauthorized")]
    Unauthorized,
    /// A valid key that lacks the scope for the operation.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed { allow: String },
    #[error("{0}")]
    Conflict(String),
    /// An `If-Match` that no longer matches.
    #[error("{0}")]
    PreconditionFailed(String),
    #[error("request body too large")]
    RequestTooLarge,
    /// The body did not arrive within the server's time for it.
    #[error("request body timed out")]
    RequestTimeout,
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("{message}")]
    RateLimited { message: String, retry_after_secs: u64 },
    /// A dependency failed; the cause is logged, never shown.
    #[error("a dependency is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A defect; the cause is logged, never shown.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    pub fn invalid(param: impl Into<Option<&'static str>>, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest { message: message.into(), param: param.into().map(str::to_owned) }
    }

    pub fn invalid_param(param: String, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest { message: message.into(), param: Some(param) }
    }

    pub fn run_not_found() -> Self {
        ApiError::NotFound("No run with that id exists for this API key.".into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::InvalidRule { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            ApiError::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::InvalidRule { .. } => "invalid_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Conflict(_) => "conflict",
            ApiError::PreconditionFailed(_) => "precondition_failed",
            ApiError::RequestTooLarge => "request_too_large",
            ApiError::RequestTimeout => "request_timeout",
            ApiError::UnsupportedMediaType => "unsupported_media_type",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    /// The message shown to the client: never a cause from inside.
    fn public_message(&self) -> String {
        match self {
            ApiError::InvalidRequest { message, .. }
            | ApiError::InvalidRule { message, .. }
            | ApiError::PreconditionFailed(message)
            | ApiError::NotFound(message)
            | ApiError::Forbidden(message)
            | ApiError::Conflict(message)
            | ApiError::RateLimited { message, .. } => message.clone(),
            ApiError::Unauthorized => "A valid API key is required: send it as `Authorization: Bearer <key>`.".into(),
            ApiError::MethodNotAllowed { allow } => {
                format!("This path does not support that method. Allowed: {allow}.")
            }
            ApiError::RequestTooLarge => "The request body is larger than 256 KiB.".into(),
            ApiError::RequestTimeout => {
                "The request body did not arrive in time. Send it whole, without pauses, and retry.".into()
            }
            ApiError::UnsupportedMediaType => {
                "Send the request body as JSON with `Content-Type: application/json`.".into()
            }
            ApiError::Unavailable(_) => {
                "The service is temporarily unavailable. Retry the request after the time in Retry-After.".into()
            }
            ApiError::Internal(_) => {
                "The service hit an internal error. Retry later; quote the x-request-id if you report it.".into()
            }
        }
    }

    pub fn into_response(self) -> ApiResponse {
        self.response(None)
    }

    /// The answer to one element of a batch: its error, with `error.index`.
    pub fn into_response_at(self, index: usize) -> ApiResponse {
        self.response(Some(index))
    }

    fn response(self, index: Option<usize>) -> ApiResponse {
        let mut error = serde_json::json!({ "code": self.code(), "message": self.public_message() });
        if let ApiError::InvalidRequest { param: Some(param), .. } = &self {
            error["param"] = param.clone().into();
        }
        let index = match &self {
            ApiError::InvalidRule { index, param, .. } => {
                error["param"] = param.clone().into();
                Some(*index)
            }
            _ => index,
        };
        if let Some(index) = index {
            error["index"] = index.into();
        }
        let mut response = json_response(self.status(), &serde_json::json!({ "error": error }));
        let headers = response.headers_mut();
        match &self {
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::MethodNotAllowed { allow } => {
                if let Ok(allow) = HeaderValue::from_str(allow) {
                    headers.insert(header::ALLOW, allow);
                }
            }
            ApiError::RateLimited { retry_after_secs, .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            }
            ApiError::Unavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(UNAVAILABLE_RETRY_AFTER_SECS));
            }
            _ => {}
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(source) | StoreError::Refused(source) => ApiError::Unavailable(source),
            StoreError::Conflict | StoreError::Defect(_) => ApiError::Internal(Box::new(error)),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(error: QueueError) -> Self {
        match error {
            QueueError::Unavailable(source) => ApiError::Unavailable(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(response: &ApiResponse) -> serde_json::Value {
        serde_json::from_slice(response.body()).unwrap()
    }

    #[test]
    fn every_error_has_its_status_code_and_headers() {
        type Header<'a> = Option<(&'a str, &'a str)>;
        let cases: Vec<(ApiError, u16, &str, Header)> = vec![
            (ApiError::invalid("input", "bad"), 400, "invalid_request", None),
            (ApiError::Unauthorized, 401, "unauthorized", Some(("www-authenticate", "Bearer"))),
            (ApiError::run_not_found(), 404, "not_found", None),
            (ApiError::MethodNotAllowed { allow: "GET".into() }, 405, "method_not_allowed", Some(("allow", "GET"))),
            (ApiError::Conflict("no".into()), 409, "conflict", None),
            (ApiError::RequestTooLarge, 413, "request_too_large", None),
            (ApiError::RequestTimeout, 408, "request_timeout", None),
            (ApiError::UnsupportedMediaType, 415, "unsupported_media_type", None),
            (
                ApiError::RateLimited { message: "slow".into(), retry_after_secs: 7 },
                429,
                "rate_limited",
                Some(("retry-after", "7")),
            ),
            (ApiError::Internal("x".into()), 500, "internal_error", None),
            (ApiError::Unavailable("x".into()), 503, "unavailable", Some(("retry-after", "1"))),
        ];
        for (error, status, code, header) in cases {
            let response = error.into_response();
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(response.headers()["content-type"], "application/json");
            assert_eq!(body(&response)["error"]["code"], code);
            if let Some((name, value)) = header {
                assert_eq!(response.headers()[name], value);
            }
        }
        let response = ApiError::invalid("limit", "bad").into_response();
        assert_eq!(body(&response)["error"]["param"], "limit");
    }

    #[test]
    fn internal_causes_never_reach_the_client() {
        let secret = "table agent-runs-runs: ProvisionedThroughputExceededException at 10.0.3.7";
        for error in [ApiError::Internal(secret.into()), ApiError::Unavailable(secret.into())] {
            let response = error.into_response();
            let text = String::from_utf8(response.body().to_vec()).unwrap();
            assert!(!text.contains("agent-runs-runs") && !text.contains("Exception"), "{text}");
        }
        let from_store: ApiError = StoreError::Defect(secret.into()).into();
        assert_eq!(from_store.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
