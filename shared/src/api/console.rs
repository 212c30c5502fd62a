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
        "/console/console.js" => ("text/javascript; charset=utf-8", include_str!("console/console.js")),
        "/console/answers.js" => ("text/javascript; charset=utf-8", include_str!("console/answers.js")),
        "/console/console.css" => ("text/css; charset=utf-8", include_str!("console/console.css")),
        _ => return None,
    };
    Some(Asset { content_type, body })
}

/// The console's answer to a request for one of its files; `None` for
/// any other path.
pub(super) fn serve(method: &Method, path: &str) -> Option<Result<ApiResponse, ApiError>> {
    let asset = asset(path)?;
    if method != Method::GET && method != Method::HEAD {
        return Some(Err(ApiError::MethodNotAllowed { allow: "GET, HEAD".into() }));
    }
    let mut response = http::Response::new(Bytes::from_static(asset.body.as_bytes()));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(Ok(response))
}
