//! `/v1/webhooks`: endpoints that receive a run's events, signed per the
//! Standard Webhooks specification; their secrets and their attempts.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use serde_json::{Value, json};

use super::body::{json_object, optional_string, reject_unknown_fields};
use super::openapi::{Parts, error_response, operation, webhook_response};
use super::query::{no_query, page_size, parameters};
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{Api, ApiError, ApiResponse};
use agent_runs_domain::{
    EventFilter, IdCursor, MAX_WEBHOOK_DESCRIPTION_CHARS, MAX_WEBHOOK_URL_BYTES, MAX_WEBHOOKS_PER_OWNER, Owner, Scope,
    WebhookEndpoint, WebhookId, WebhookSecret, WebhookStatus,
};
use agent_runs_ports::views::{DeletedView, DeliveryAttemptView, PageView, WebhookView};

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;
const LIST_NAME: &str = "webhooks";

fn parse_webhook_id(text: &str) -> Result<WebhookId, ApiError> {
    text.parse().map_err(|_| webhook_not_found())
}

fn webhook_not_found() -> ApiError {
    ApiError::NotFound("No webhook endpoint with that id exists for this API key.".into())
}

fn events(value: Option<Value>) -> Result<EventFilter, ApiError> {
    let message = "`events` is required: a list of event types, or [\"*\"] for every event.";
    let Some(Value::Array(items)) = value else {
        return Err(ApiError::invalid("events", message));
    };
    let types = items
        .into_iter()
        .map(|item| match item {
            Value::String(text) => Ok(text),
            _ => Err(ApiError::invalid("events", message)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    EventFilter::parse(types).map_err(|error| ApiError::invalid("events", error.to_string()))
}

fn url(value: Option<Value>, allow_private: bool) -> Result<String, ApiError> {
    let Some(Value::String(url)) = value else {
        return Err(ApiError::invalid("url", "`url` is required: the https URL that receives the events."));
    };
    if url.len() > MAX_WEBHOOK_URL_BYTES {
        return Err(ApiError::invalid("url", format!("`url` is longer than {MAX_WEBHOOK_URL_BYTES} bytes.")));
    }
    crate::webhooks::check_url(&url, allow_private)
        .map_err(|problem| ApiError::invalid("url", format!("`url` cannot receive events: {problem}.")))?;
    Ok(url)
}

/// A list's `limit` and `cursor`.
fn page(query: Option<&str>, owner: &Owner, list: &str) -> Result<(u32, Option<ulid::Ulid>), ApiError> {
    let [limit, cursor] = parameters(query, ["limit", "cursor"])?;
    let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let after = cursor
        .map(|text| IdCursor::decode(&text, owner, list))
        .transpose()
        .map_err(|error| ApiError::invalid("cursor", error.to_string()))?;
    Ok((limit, after.map(|cursor| cursor.last)))
}

pub(super) async fn create(api: &Api, owner: &Owner, request: &Request<Bytes>) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let mut body = json_object(request.headers(), request.body(), false)?;
    reject_unknown_fields(&body, &["url", "events", "description"])?;
    let url = url(body.remove("url"), api.webhook_allow_private)?;
    let events = events(body.remove("events"))?;
    let description = optional_string(&mut body, "description")?;
    if description.as_ref().is_some_and(|text| text.chars().count() > MAX_WEBHOOK_DESCRIPTION_CHARS) {
        return Err(ApiError::invalid(
            "description",
            format!("`description` is longer than {MAX_WEBHOOK_DESCRIPTION_CHARS} characters."),
        ));
    }
    let now = api.clock.now();
    let endpoint = WebhookEndpoint {
        id: WebhookId::from_ulid(api.ids.ulid_at(now)),
        owner: owner.clone(),
        url,
        events,
        description,
        status: WebhookStatus::Enabled,
        created_at: now,
        secret: WebhookSecret::generate(),
        previous_secrets: Vec::new(),
        failing_since: None,
    };
    if !api.webhooks.create_webhook(&endpoint, MAX_WEBHOOKS_PER_OWNER).await? {
        return Err(ApiError::invalid(
            None,
            format!(
                "This owner already has {MAX_WEBHOOKS_PER_OWNER} webhook endpoints, the most allowed; delete one first."
            ),
        ));
    }
    Ok(json_response(StatusCode::CREATED, &WebhookView::with_secret(&endpoint)))
}

pub(super) async fn list(api: &Api, owner: &Owner, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    let (limit, after) = page(query, owner, LIST_NAME)?;
    let page = api.webhooks.list_webhooks(owner, after.map(WebhookId::from_ulid), limit).await?;
    let next_cursor = page
        .has_more
        .then(|| page.items.last())
        .flatten()
        .map(|last| IdCursor { last: last.id.ulid() }.encode(owner, LIST_NAME));
    let view = PageView { data: page.items.iter().map(WebhookView::from).collect(), next_cursor };
    Ok(json_response(StatusCode::OK, &view))
}

async fn find(api: &Api, owner: &Owner, id: &str) -> Result<WebhookEndpoint, ApiError> {
    let id = parse_webhook_id(id)?;
    api.webhooks.get_webhook(owner, id).await?.ok_or_else(webhook_not_found)
}

pub(super) async fn get(api: &Api, owner: &Owner, id: &str, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    let endpoint = find(api, owner, id).await?;
    Ok(json_response(StatusCode::OK, &WebhookView::from(&endpoint)))
}

pub(super) async fn delete(api: &Api, owner: &Owner, id: &str, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    let id = parse_webhook_id(id)?;
    if !api.webhooks.delete_webhook(owner, id).await? {
        return Err(webhook_not_found());
    }
    Ok(json_response(StatusCode::OK, &DeletedView { id: id.to_string(), deleted: true }))
}

pub(super) async fn rotate_secret(
    api: &Api,
    owner: &Owner,
    id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    no_query(request.uri().query())?;
    let body = json_object(request.headers(), request.body(), true)?;
    reject_unknown_fields(&body, &[])?;
    let mut endpoint = find(api, owner, id).await?;
    let replaced = endpoint.secret.clone();
    endpoint.rotate_secret(api.clock.now());
    if !api.webhooks.rotate_webhook_secret(&endpoint, &replaced).await? {
        // Deleted, or rotated by another request, since it was read.
        find(api, owner, id).await?;
        return Err(ApiError::Conflict(
            "The secret was rotated by another request at the same moment; its answer holds the new secret.".into(),
        ));
    }
    Ok(json_response(StatusCode::OK, &WebhookView::with_secret(&endpoint)))
}

pub(super) async fn deliveries(
    api: &Api,
    owner: &Owner,
    id: &str,
    query: Option<&str>,
) -> Result<ApiResponse, ApiError> {
    let endpoint = find(api, owner, id).await?;
    let list = endpoint.id.to_string();
    let (limit, after) = page(query, owner, &list)?;
    let page =
        api.webhooks.deliveries(owner, endpoint.id, after.map(agent_runs_domain::DeliveryId::from_ulid), limit).await?;
    let next_cursor = page
        .has_more
        .then(|| page.items.last())
        .flatten()
        .map(|last| IdCursor { last: last.id.ulid() }.encode(owner, &list));
    let view = PageView { data: page.items.iter().map(DeliveryAttemptView::from).collect(), next_cursor };
    Ok(json_response(StatusCode::OK, &view))
}

pub(super) const CREATE: Route = Route {
    operation: Operation::CreateWebhook,
    method: Method::POST,
    path: "/v1/webhooks",
    operation_id: "createWebhook",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(create(api, call.owner(), call.request)),
    },
    describe: Some(describe_create),
};

fn describe_create(route: &Route, _parts: &Parts<'_>) -> Value {
    let mut created =
        webhook_response("The endpoint, with its signing secret (shown only here and by rotate-secret).", true);
    let by_id =
        |operation_id: &str| json!({"operationId": operation_id, "parameters": {"webhook_id": "$response.body#/id"}});
    created["links"] = json!({
        "GetWebhook": by_id("getWebhook"),
        "ListWebhookDeliveries": by_id("listWebhookDeliveries"),
        "RotateWebhookSecret": by_id("rotateWebhookSecret"),
        "DeleteWebhook": by_id("deleteWebhook")
    });
    operation(
        route.operation_id,
        "Create a webhook endpoint",
        json!([]),
        Some(
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreateWebhook"}}}}),
        ),
        json!({"201": created}),
    )
}

pub(super) const LIST: Route = Route {
    operation: Operation::ListWebhooks,
    method: Method::GET,
    path: "/v1/webhooks",
    operation_id: "listWebhooks",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(list(api, call.owner(), call.query())),
    },
    describe: Some(describe_list),
};

fn describe_list(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { page_parameters, .. } = parts;
    operation(
        route.operation_id,
        "List webhook endpoints, newest first",
        page_parameters.clone(),
        None,
        json!({"200": {
            "description": "One page of endpoints (no secrets).",
            "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/WebhookList"}}}
        }}),
    )
}

pub(super) const GET: Route = Route {
    operation: Operation::GetWebhook,
    method: Method::GET,
    path: "/v1/webhooks/{webhook_id}",
    operation_id: "getWebhook",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(get(api, call.owner(), call.param("webhook_id"), call.query())),
    },
    describe: Some(describe_get),
};

fn describe_get(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { webhook_id, webhook_not_found, .. } = parts;
    operation(
        route.operation_id,
        "Get a webhook endpoint",
        json!([webhook_id]),
        None,
        json!({"200": webhook_response("The endpoint (no secret).", false), "404": webhook_not_found.clone()}),
    )
}

pub(super) const DELETE: Route = Route {
    operation: Operation::DeleteWebhook,
    method: Method::DELETE,
    path: "/v1/webhooks/{webhook_id}",
    operation_id: "deleteWebhook",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(delete(api, call.owner(), call.param("webhook_id"), call.query())),
    },
    describe: Some(describe_delete),
};

fn describe_delete(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { webhook_id, webhook_not_found, .. } = parts;
    operation(
        route.operation_id,
        "Delete a webhook endpoint",
        json!([webhook_id]),
        None,
        json!({
            "200": {
                "description": "Deleted: deliveries not yet made are dropped.",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Deleted"}}}
            },
            "404": webhook_not_found.clone()
        }),
    )
}

pub(super) const ROTATE_SECRET: Route = Route {
    operation: Operation::RotateWebhookSecret,
    method: Method::POST,
    path: "/v1/webhooks/{webhook_id}/rotate-secret",
    operation_id: "rotateWebhookSecret",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(rotate_secret(api, call.owner(), call.param("webhook_id"), call.request)),
    },
    describe: Some(describe_rotate_secret),
};

fn describe_rotate_secret(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { webhook_id, webhook_not_found, .. } = parts;
    operation(
        route.operation_id,
        "Rotate a webhook endpoint's signing secret",
        json!([webhook_id]),
        Some(
            json!({"required": false, "content": {"application/json": {"schema": {"type": "object", "additionalProperties": false, "maxProperties": 0}}}}),
        ),
        json!({
            "200": webhook_response("The endpoint with its new secret. For 24 hours deliveries carry a signature with the old secret too.", true),
            "404": webhook_not_found.clone(),
            "409": error_response("Another rotation happened at the same moment; its answer holds the secret.", &[])
        }),
    )
}

pub(super) const DELIVERIES: Route = Route {
    operation: Operation::ListWebhookDeliveries,
    method: Method::GET,
    path: "/v1/webhooks/{webhook_id}/deliveries",
    operation_id: "listWebhookDeliveries",
    function: "webhooks",
    handler: Handler::Keyed {
        scope: Scope::WebhooksManage,
        handle: |api, call| Box::pin(deliveries(api, call.owner(), call.param("webhook_id"), call.query())),
    },
    describe: Some(describe_deliveries),
};

fn describe_deliveries(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { webhook_id, webhook_not_found, page_parameters, .. } = parts;
    operation(
        route.operation_id,
        "List a webhook endpoint's delivery attempts, newest first",
        json!([webhook_id, page_parameters[0], page_parameters[1]]),
        None,
        json!({
            "200": {
                "description": "One page of attempts (kept 30 days).",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeliveryList"}}}
            },
            "404": webhook_not_found.clone()
        }),
    )
}
