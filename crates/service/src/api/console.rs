//! `GET /console`: the web console, plain HTML, CSS and JavaScript built
//! into the binary, served without a key (the person types one in). It
//! calls the API from the same origin, so a strict Content-Security-Policy
//! allows only this origin's script, style and requests.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};

use super::routes::{Answers, FALLBACK_FUNCTION, Handler, Operation, Public, Route, always};
use super::{ApiError, ApiResponse, not_found_path};

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

pub(super) const PAGE: Route = public(Operation::Console, "/console", |_, request| Box::pin(file(request)), always);
/// Only the files the console has: any other name is an unknown path.
pub(super) const FILE: Route = public(
    Operation::ConsoleFile,
    "/console/{file}",
    |_, request| Box::pin(file(request)),
    |path, _| asset(path).is_some(),
);
/// Browsers ask for it at the root; the page names its own.
pub(super) const FAVICON: Route =
    public(Operation::Favicon, "/favicon.ico", |_, request| Box::pin(file(request)), always);
/// The root is a person's only when the request carries no key: to an API
/// client with one it stays an unknown path (`404`).
pub(super) const FROM_ROOT: Route = public(
    Operation::ConsoleFromRoot,
    "/",
    |_, _| Box::pin(async { Ok(redirect("console")) }),
    |_, with_key| !with_key,
);
pub(super) const FROM_FOLDER: Route =
    public(Operation::ConsoleFromFolder, "/console/", |_, _| Box::pin(async { Ok(redirect("../console")) }), always);

/// A console route: read by anyone, served by the function behind
/// `$default` (and by every other), not in the OpenAPI document.
const fn public(operation: Operation, path: &'static str, handle: Public, answers: Answers) -> Route {
    Route {
        operation,
        method: Method::GET,
        path,
        operation_id: "",
        function: FALLBACK_FUNCTION,
        handler: Handler::Public { handle, answers },
        describe: None,
    }
}

async fn file(request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    let asset = asset(request.uri().path()).ok_or_else(not_found_path)?;
    Ok(answer(http::StatusCode::OK, asset.body, Some(asset.content_type), None))
}

/// Relative, so that a stage or base path before the address is kept.
/// Temporary: the root's answer depends on the key, so no cache keeps it.
fn redirect(location: &'static str) -> ApiResponse {
    answer(http::StatusCode::TEMPORARY_REDIRECT, "", None, Some(location))
}

fn answer(
    status: http::StatusCode,
    body: &'static str,
    content_type: Option<&'static str>,
    location: Option<&'static str>,
) -> ApiResponse {
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
    response
}
