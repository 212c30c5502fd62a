//! `GET /console`: the web console, plain HTML, CSS and JavaScript built
//! into the binary, served without a key (the person types one in). It
//! calls the API from the same origin, so a strict Content-Security-Policy
//! allows only this origin's script, style and requests.

use bytes::Bytes;
use http::{HeaderValue, Method, header};

use super::{ApiError, ApiResponse};

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct Asset {
    content_type: &'static str,
    body: &'static str,
}

fn asset(path: &str) -> Option<Asset> {
    let (content_type, body) = match path {
        // One address only: the page's relative links resolve from it, also
        // under an API Gateway stage or a custom domain's base path.
        "/console" => ("text/html; charset=utf-8", include_str!("console/index.html")),
        // The entry module (the page's one script) and the modules it imports.
        "/console/console.js" => ("text/javascript; charset=utf-8", include_str!("console/console.js")),
        "/console/state.js" => ("text/javascript; charset=utf-8", include_str!("console/state.js")),
        "/console/api.js" => ("text/javascript; charset=utf-8", include_str!("console/api.js")),
        "/console/dom.js" => ("text/javascript; charset=utf-8", include_str!("console/dom.js")),
        "/console/notice.js" => ("text/javascript; charset=utf-8", include_str!("console/notice.js")),
        "/console/list.js" => ("text/javascript; charset=utf-8", include_str!("console/list.js")),
        "/console/inbox.js" => ("text/javascript; charset=utf-8", include_str!("console/inbox.js")),
        "/console/runs.js" => ("text/javascript; charset=utf-8", include_str!("console/runs.js")),
        "/console/policy.js" => ("text/javascript; charset=utf-8", include_str!("console/policy.js")),
        "/console/detail.js" => ("text/javascript; charset=utf-8", include_str!("console/detail.js")),
        "/console/approvals.js" => ("text/javascript; charset=utf-8", include_str!("console/approvals.js")),
        "/console/events.js" => ("text/javascript; charset=utf-8", include_str!("console/events.js")),
        "/console/answers.js" => ("text/javascript; charset=utf-8", include_str!("console/answers.js")),
        "/console/arguments.js" => ("text/javascript; charset=utf-8", include_str!("console/arguments.js")),
        "/console/conversation.js" => ("text/javascript; charset=utf-8", include_str!("console/conversation.js")),
        "/console/people.js" => ("text/javascript; charset=utf-8", include_str!("console/people.js")),
        "/console/console.css" => ("text/css; charset=utf-8", include_str!("console/console.css")),
        // Browsers ask for it at the root; the page names it too.
        "/favicon.ico" | "/console/favicon.svg" => ("image/svg+xml", include_str!("console/favicon.svg")),
        _ => return None,
    };
    Some(Asset { content_type, body })
}

/// Where the addresses people type for the console lead: relative, so
/// that a stage or base path before them is kept. The root is a person's
/// only when the request carries no key: to an API client it stays an
/// unknown path (`404`).
fn redirect(path: &str, with_key: bool) -> Option<&'static str> {
    match path {
        "/" if !with_key => Some("console"),
        "/console/" => Some("../console"),
        _ => None,
    }
}

/// The console's answer to a request for one of its files (or an address
/// that leads to it); `None` for any other path.
pub(super) fn serve(method: &Method, path: &str, with_key: bool) -> Option<Result<ApiResponse, ApiError>> {
    // Temporary: the root's answer depends on the key, so no cache keeps it.
    let (status, body, content_type, location) = match redirect(path, with_key) {
        Some(location) => (http::StatusCode::TEMPORARY_REDIRECT, "", None, Some(location)),
        None => {
            let asset = asset(path)?;
            (http::StatusCode::OK, asset.body, Some(asset.content_type), None)
        }
    };
    if method != Method::GET && method != Method::HEAD {
        return Some(Err(ApiError::MethodNotAllowed { allow: "GET, HEAD".into() }));
    }
    let mut response = http::Response::new(Bytes::from_static(body.as_bytes()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Some(content_type) = content_type {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    if let Some(location) = location {
        headers.insert(header::LOCATION, HeaderValue::from_static(location));
        headers.insert(header::VARY, HeaderValue::from_static("authorization"));
    }
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(Ok(response))
}
