//! Webhook endpoints and their attempts in the table. An owner's endpoints
//! share a partition (the notifier reads them with one Query per owner),
//! counted by an item in the same partition so the limit per owner holds
//! exactly; each endpoint's attempts have a partition of their own and
//! expire after 30 days (the table's TTL).

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem, Update};
use aws_smithy_runtime_api::http::Response as HttpResponse;
use serde::{Deserialize, Serialize};

use super::calls::TransactFailure;
use super::items::{decode_event_item, defect, text, unavailable};
use super::{DynamoStore, Item, n, s};
use agent_runs_domain::{
    DeliveryAttempt, DeliveryId, EndpointHealth, EventFilter, Owner, RunId, Timestamp, WebhookEndpoint, WebhookId,
    WebhookSecret, WebhookStatus,
};
use agent_runs_ports::store::{
    Page, StoreError, StoredEvent, StoredSecret, WebhookStore, decode_previous_secrets, encode_previous_secrets,
};

/// The sort key prefix of event items: what the notifier's stream filter
/// lets through.
pub const NOTIFIED_EVENT_PREFIX: &str = "EV#";
const ATTEMPTS_KEPT_FOR_SECS: i64 = 30 * 24 * 60 * 60;
/// A claim of a retry is needed while copies of its message may come: days.
const RETRY_CLAIM_KEPT_FOR_SECS: i64 = 3 * 24 * 60 * 60;

fn endpoints_pk(owner: &Owner) -> String {
    format!("WEBHOOKS#{owner}")
}

fn endpoint_sk(id: WebhookId) -> String {
    format!("WH#{id}")
}

fn attempts_pk(id: WebhookId) -> String {
    format!("WH#{id}")
}

#[derive(Serialize, Deserialize)]
struct EndpointItem {
    webhook_id: WebhookId,
    owner: Owner,
    url: String,
    events: Vec<String>,
    description: Option<String>,
    status: String,
    created_at: Timestamp,
    secret: String,
    #[serde(default)]
    previous_secrets: Vec<StoredSecret>,
    failing_since: Option<Timestamp>,
}

fn encode_endpoint(endpoint: &WebhookEndpoint) -> Result<Item, StoreError> {
    let item = EndpointItem {
        webhook_id: endpoint.id,
        owner: endpoint.owner.clone(),
        url: endpoint.url.clone(),
        events: endpoint.events.names(),
        description: endpoint.description.clone(),
        status: endpoint.status.as_str().to_owned(),
        created_at: endpoint.created_at,
        secret: endpoint.secret.expose(),
        previous_secrets: encode_previous_secrets(&endpoint.previous_secrets),
        failing_since: endpoint.failing_since,
    };
    let mut item: Item = serde_dynamo::to_item(item).map_err(defect)?;
    item.insert("pk".into(), s(endpoints_pk(&endpoint.owner)));
    item.insert("sk".into(), s(endpoint_sk(endpoint.id)));
    Ok(item)
}

fn decode_endpoint(item: Item) -> Result<WebhookEndpoint, StoreError> {
    let item: EndpointItem = serde_dynamo::from_item(item).map_err(defect)?;
    let malformed = |what: &str| defect(format!("malformed stored webhook: {what}"));
    Ok(WebhookEndpoint {
        id: item.webhook_id,
        owner: item.owner,
        url: item.url,
        events: EventFilter::stored(item.events),
        description: item.description,
        status: WebhookStatus::parse(&item.status).ok_or_else(|| malformed("status"))?,
        created_at: item.created_at,
        secret: WebhookSecret::parse(&item.secret).ok_or_else(|| malformed("secret"))?,
        previous_secrets: decode_previous_secrets(item.previous_secrets)?,
        failing_since: item.failing_since,
    })
}

/// Whether a conditional write was made (`Ok(false)`: its condition was
/// false, nothing written).
fn condition_held<O, E>(result: Result<O, SdkError<E, HttpResponse>>) -> Result<bool, StoreError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match result {
        Ok(_) => Ok(true),
        Err(error)
            if error.as_service_error().and_then(|error| error.code()) == Some("ConditionalCheckFailedException") =>
        {
            Ok(false)
        }
        Err(error) => Err(unavailable(error)),
    }
}

/// The endpoint of an item, or `None` (logged) for one that cannot be
/// read: never a reason to fail the others.
fn readable(owner: &Owner, item: Item) -> Option<WebhookEndpoint> {
    decode_endpoint(item)
        .inspect_err(|error| tracing::error!(%owner, %error, "a webhook endpoint cannot be read; left out"))
        .ok()
}

#[derive(Serialize, Deserialize)]
struct AttemptItem {
    delivery_id: DeliveryId,
    webhook_id: WebhookId,
    event_id: String,
    #[serde(rename = "type")]
    event_type: String,
    attempt: u32,
    http_status: Option<u16>,
    error: Option<String>,
    duration_ms: u64,
    at: Timestamp,
    /// Seconds since the epoch: the table's TTL removes the item then.
    expires_at: i64,
}

/// A run's event from a record of the table's stream (its new image), with
/// the owner and run it belongs to; `None` for any other item.
pub fn decode_stream_event(item: &Item) -> Option<Result<(Owner, RunId, StoredEvent), StoreError>> {
    let sk = item.get("sk")?.as_s().ok()?;
    if !sk.starts_with(NOTIFIED_EVENT_PREFIX) {
        return None;
    }
    let decode = || -> Result<(Owner, RunId, StoredEvent), StoreError> {
        let run_id = text(item, "pk")?
            .strip_prefix("RUN#")
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| defect("an event item's pk is not a run's"))?;
        let owner = Owner::parse(text(item, "owner")?).map_err(|_| defect("an event item without a valid owner"))?;
        Ok((owner, run_id, decode_event_item(item)?))
    };
    Some(decode())
}

impl DynamoStore {
    /// The items of partition `pk` whose sort key starts with `prefix`.
    fn prefix_query(&self, pk: &str, prefix: &str) -> QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
            .expression_attribute_values(":pk", s(pk))
            .expression_attribute_values(":prefix", s(prefix))
    }

    /// Every endpoint of the owner (at most 20: one Query). One that
    /// cannot be read is logged and left out, never a reason to hold up
    /// the others' deliveries.
    pub async fn owner_webhooks(&self, owner: &Owner) -> Result<Vec<WebhookEndpoint>, StoreError> {
        Ok(self.list_webhooks(owner, None, agent_runs_domain::MAX_WEBHOOKS_PER_OWNER as u32).await?.items)
    }

    /// Claims the queueing of a delivery's next message (after `attempts`) for
    /// the SQS message `claimer`: `Ok(false)` when another message claimed
    /// it first. The same message may claim again (its send failed).
    pub async fn claim_retry(
        &self,
        webhook_id: WebhookId,
        run_id: RunId,
        seq: u64,
        attempts: u32,
        claimer: &str,
    ) -> Result<bool, StoreError> {
        let expires_at =
            agent_runs_domain::Clock::now(&agent_runs_domain::SystemClock).millis() / 1_000 + RETRY_CLAIM_KEPT_FOR_SECS;
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(attempts_pk(webhook_id)))
            .item("sk", s(format!("NEXT#{run_id}#{seq}#{attempts}")))
            .item("claimer", s(claimer))
            .item("expires_at", n(expires_at))
            .condition_expression("attribute_not_exists(pk) OR claimer = :claimer")
            .expression_attribute_values(":claimer", s(claimer))
            .send()
            .await;
        condition_held(result)
    }

    fn endpoint_count(&self, owner: &Owner, delta: i64, max: Option<usize>) -> Result<Update, StoreError> {
        self.counter((endpoints_pk(owner), "COUNT"), "endpoints", delta, max.map(|max| max as u64))
    }

    /// Whether `endpoint` is stored as this create wrote it (its fresh id
    /// and random secret are nobody else's).
    async fn written_endpoint(&self, endpoint: &WebhookEndpoint) -> Result<bool, StoreError> {
        let stored = self.get_webhook(&endpoint.owner, endpoint.id).await?;
        Ok(stored.is_some_and(|stored| {
            stored.created_at == endpoint.created_at && stored.secret.expose() == endpoint.secret.expose()
        }))
    }
}

#[async_trait]
impl WebhookStore for DynamoStore {
    async fn create_webhook(&self, endpoint: &WebhookEndpoint, max_per_owner: usize) -> Result<bool, StoreError> {
        let put = Put::builder()
            .table_name(&self.table)
            .set_item(Some(encode_endpoint(endpoint)?))
            .condition_expression("attribute_not_exists(pk)")
            .build()
            .map_err(defect)?;
        let items = vec![
            TransactWriteItem::builder().update(self.endpoint_count(&endpoint.owner, 1, Some(max_per_owner))?).build(),
            TransactWriteItem::builder().put(put).build(),
        ];
        match self.transact(items).await {
            Ok(()) => Ok(true),
            // A fresh id is only ever taken by this very write: an earlier
            // send of it landed though its answer was lost (the count then
            // refuses the resend too, when that send took the last place).
            Err(TransactFailure::ConditionsFailed(failed)) if failed.get(1) == Some(&true) => {
                match self.written_endpoint(endpoint).await? {
                    true => Ok(true),
                    false if failed.first() == Some(&true) => Ok(false),
                    false => Err(defect("a new webhook id was already taken")),
                }
            }
            Err(TransactFailure::ConditionsFailed(_)) => Ok(false),
            // The outcome is unknown: found written, it was.
            Err(TransactFailure::Store(error)) => match self.written_endpoint(endpoint).await {
                Ok(true) => Ok(true),
                _ => Err(error),
            },
            Err(TransactFailure::Refused(error)) => Err(error),
        }
    }

    async fn get_webhook(&self, owner: &Owner, id: WebhookId) -> Result<Option<WebhookEndpoint>, StoreError> {
        self.get_item(endpoints_pk(owner), endpoint_sk(id)).await?.map(decode_endpoint).transpose()
    }

    async fn list_webhooks(
        &self,
        owner: &Owner,
        before: Option<WebhookId>,
        limit: u32,
    ) -> Result<Page<WebhookEndpoint>, StoreError> {
        let pk = endpoints_pk(owner);
        let query = self.prefix_query(&pk, "WH#").scan_index_forward(false).consistent_read(true);
        let start_after = before.map(|id| Item::from([("pk".into(), s(&pk)), ("sk".into(), s(endpoint_sk(id)))]));
        let items = self.query_up_to(query, start_after, limit as usize + 1, Ok).await?;
        let has_more = items.len() > limit as usize;
        let items = items.into_iter().take(limit as usize).filter_map(|item| readable(owner, item)).collect();
        Ok(Page { items, has_more })
    }

    async fn delete_webhook(&self, owner: &Owner, id: WebhookId) -> Result<bool, StoreError> {
        let delete = Delete::builder()
            .table_name(&self.table)
            .key("pk", s(endpoints_pk(owner)))
            .key("sk", s(endpoint_sk(id)))
            .condition_expression("attribute_exists(pk)")
            .build()
            .map_err(defect)?;
        let items = vec![
            TransactWriteItem::builder().delete(delete).build(),
            TransactWriteItem::builder().update(self.endpoint_count(owner, -1, None)?).build(),
        ];
        // Its attempts expire with the TTL; deliveries queued for it find
        // no endpoint and are dropped.
        match self.transact(items).await {
            Ok(()) => Ok(true),
            Err(TransactFailure::ConditionsFailed(_)) => Ok(false),
            Err(TransactFailure::Store(error) | TransactFailure::Refused(error)) => Err(error),
        }
    }

    async fn rotate_webhook_secret(
        &self,
        endpoint: &WebhookEndpoint,
        replaced: &WebhookSecret,
    ) -> Result<bool, StoreError> {
        let previous: AttributeValue =
            serde_dynamo::to_attribute_value(encode_previous_secrets(&endpoint.previous_secrets)).map_err(defect)?;
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(endpoints_pk(&endpoint.owner)))
            .key("sk", s(endpoint_sk(endpoint.id)))
            .update_expression("SET secret = :secret, previous_secrets = :previous")
            .condition_expression("secret = :replaced")
            .expression_attribute_values(":secret", s(endpoint.secret.expose()))
            .expression_attribute_values(":previous", previous)
            .expression_attribute_values(":replaced", s(replaced.expose()))
            .send()
            .await;
        condition_held(result)
    }

    async fn deliveries(
        &self,
        owner: &Owner,
        id: WebhookId,
        before: Option<DeliveryId>,
        limit: u32,
    ) -> Result<Page<DeliveryAttempt>, StoreError> {
        // The endpoint's partition holds only its attempts; whose it is,
        // the caller checked by reading the endpoint.
        let _ = owner;
        let pk = attempts_pk(id);
        let query = self.prefix_query(&pk, "DLV#").scan_index_forward(false);
        let start_after = before.map(|id| Item::from([("pk".into(), s(&pk)), ("sk".into(), s(format!("DLV#{id}")))]));
        let items = self.query_up_to(query, start_after, limit as usize + 1, Ok).await?;
        let has_more = items.len() > limit as usize;
        let items = items
            .into_iter()
            .take(limit as usize)
            .map(|item| {
                let item: AttemptItem = serde_dynamo::from_item(item).map_err(defect)?;
                Ok(DeliveryAttempt {
                    id: item.delivery_id,
                    webhook_id: item.webhook_id,
                    event_id: item.event_id,
                    event_type: item.event_type,
                    attempt: item.attempt,
                    http_status: item.http_status,
                    error: item.error,
                    duration_ms: item.duration_ms,
                    at: item.at,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Page { items, has_more })
    }

    async fn record_attempt(
        &self,
        owner: &Owner,
        attempt: &DeliveryAttempt,
        health: EndpointHealth,
    ) -> Result<(), StoreError> {
        let item = AttemptItem {
            delivery_id: attempt.id,
            webhook_id: attempt.webhook_id,
            event_id: attempt.event_id.clone(),
            event_type: attempt.event_type.clone(),
            attempt: attempt.attempt,
            http_status: attempt.http_status,
            error: attempt.error.clone(),
            duration_ms: attempt.duration_ms,
            at: attempt.at,
            expires_at: attempt.at.millis() / 1_000 + ATTEMPTS_KEPT_FOR_SECS,
        };
        let mut item: Item = serde_dynamo::to_item(item).map_err(defect)?;
        item.insert("pk".into(), s(attempts_pk(attempt.webhook_id)));
        item.insert("sk".into(), s(format!("DLV#{}", attempt.id)));
        self.client.put_item().table_name(&self.table).set_item(Some(item)).send().await.map_err(unavailable)?;
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(endpoints_pk(owner)))
            .key("sk", s(endpoint_sk(attempt.webhook_id)))
            .condition_expression("attribute_exists(pk)");
        let update = match health {
            EndpointHealth::Healthy => update.update_expression("REMOVE failing_since"),
            EndpointHealth::FailingSince(since) => update
                // Kept when set: an attempt made on an older read of the
                // endpoint never moves the start of its failures.
                .update_expression("SET failing_since = if_not_exists(failing_since, :since)")
                .expression_attribute_values(":since", n(since.millis())),
            EndpointHealth::Disable => update
                .update_expression("SET #status = :disabled")
                .expression_attribute_names("#status", "status")
                .expression_attribute_values(":disabled", s(WebhookStatus::Disabled.as_str())),
        };
        // Deleted meanwhile: nothing to mark.
        condition_held(update.send().await).map(|_| ())
    }
}
