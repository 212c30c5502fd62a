//! Webhook endpoints, the outbox of their deliveries and the record of
//! attempts, in the embedded database.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{EVENT_COLUMNS, SqliteStore, event_row, unavailable};
use agent_runs_domain::{
    DeliveryAttempt, DeliveryId, EndpointHealth, Event, EventFilter, Owner, PreviousSecret, Timestamp, WebhookEndpoint,
    WebhookId, WebhookSecret, WebhookStatus,
};
use agent_runs_ports::store::{
    DueSkip, Outbox, Page, PendingDelivery, StoreError, WebhookStore, decode_previous_secrets, encode_previous_secrets,
};

/// Attempts older than this are removed as new ones are recorded.
const ATTEMPTS_KEPT_FOR_MILLIS: i64 = 30 * 24 * 60 * 60 * 1000;

const ENDPOINT_COLUMNS: &str =
    "id, owner, url, events, description, status, created_at, secret, previous_secrets, failing_since";

/// Queues a delivery of each event to each of the owner's enabled endpoints
/// that wants it, in the transaction that writes the events.
pub(super) fn enqueue_deliveries(connection: &Connection, owner: &Owner, events: &[Event]) -> Result<bool, StoreError> {
    let mut statement = connection
        .prepare_cached(
            "INSERT INTO webhook_outbox (webhook_id, run_id, seq, next_attempt_at)
             SELECT id, ?2, ?3, ?4 FROM webhooks
             WHERE owner = ?1 AND status = 'enabled'
               AND EXISTS (SELECT 1 FROM json_each(webhooks.events) WHERE value IN ('*', ?5))",
        )
        .map_err(unavailable)?;
    // A run's second event says its create went through: its run.created,
    // held until then, is due with it (and taken first: the older row).
    let mut wake = connection
        .prepare_cached(
            "UPDATE webhook_outbox SET next_attempt_at = ?2
             WHERE run_id = ?1 AND seq = 1 AND attempts = 0 AND next_attempt_at > ?2",
        )
        .map_err(unavailable)?;
    let mut queued = 0;
    for event in events {
        if event.seq == 2 {
            queued += wake.execute(params![event.run_id.to_string(), event.at.millis()]).map_err(unavailable)?;
        }
        queued += statement
            .execute(params![
                owner.as_str(),
                event.run_id.to_string(),
                event.seq as i64,
                event.at.millis(),
                event.data.kind()
            ])
            .map_err(unavailable)?;
    }
    Ok(queued > 0)
}

fn defect(what: &str) -> StoreError {
    StoreError::Defect(format!("malformed stored webhook: {what}"))
}

fn endpoint_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<EndpointRow> {
    Ok(EndpointRow {
        id: row.get(0)?,
        owner: row.get(1)?,
        url: row.get(2)?,
        events: row.get(3)?,
        description: row.get(4)?,
        status: row.get(5)?,
        created_at: row.get(6)?,
        secret: row.get(7)?,
        previous_secrets: row.get(8)?,
        failing_since: row.get(9)?,
    })
}

struct EndpointRow {
    id: String,
    owner: String,
    url: String,
    events: String,
    description: Option<String>,
    status: String,
    created_at: i64,
    secret: String,
    previous_secrets: String,
    failing_since: Option<i64>,
}

impl EndpointRow {
    fn decode(self) -> Result<WebhookEndpoint, StoreError> {
        let events: Vec<String> = serde_json::from_str(&self.events).map_err(|_| defect("events"))?;
        let previous = serde_json::from_str(&self.previous_secrets).map_err(|_| defect("previous secrets"))?;
        Ok(WebhookEndpoint {
            id: self.id.parse().map_err(|_| defect("id"))?,
            owner: Owner::parse(&self.owner).map_err(|_| defect("owner"))?,
            url: self.url,
            events: EventFilter::stored(events),
            description: self.description,
            status: WebhookStatus::parse(&self.status).ok_or_else(|| defect("status"))?,
            created_at: Timestamp::from_millis(self.created_at),
            secret: WebhookSecret::parse(&self.secret).ok_or_else(|| defect("secret"))?,
            previous_secrets: decode_previous_secrets(previous)?,
            failing_since: self.failing_since.map(Timestamp::from_millis),
        })
    }
}

fn previous_secrets_json(previous: &[PreviousSecret]) -> Result<String, StoreError> {
    serde_json::to_string(&encode_previous_secrets(previous)).map_err(|error| StoreError::Defect(error.to_string()))
}

fn find_endpoint(connection: &Connection, id: &str) -> Result<Option<WebhookEndpoint>, StoreError> {
    connection
        .prepare_cached(&format!("SELECT {ENDPOINT_COLUMNS} FROM webhooks WHERE id = ?1"))
        .and_then(|mut statement| statement.query_row(params![id], endpoint_from_row).optional())
        .map_err(unavailable)?
        .map(EndpointRow::decode)
        .transpose()
}

/// Writes the attempt and its effect on its endpoint.
fn record(connection: &Connection, attempt: &DeliveryAttempt, health: EndpointHealth) -> Result<(), StoreError> {
    let webhook_id = attempt.webhook_id.to_string();
    connection
        .prepare_cached(
            "INSERT INTO webhook_attempts
             (webhook_id, id, event_id, type, attempt, http_status, error, duration_ms, at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                webhook_id,
                attempt.id.to_string(),
                attempt.event_id,
                attempt.event_type,
                attempt.attempt,
                attempt.http_status,
                attempt.error,
                attempt.duration_ms.min(i64::MAX as u64) as i64,
                attempt.at.millis()
            ])
        })
        .map_err(unavailable)?;
    // Attempt ids are ULIDs: older ones sort lower.
    let oldest_kept = DeliveryId::from_ulid(ulid::Ulid::from_parts(
        (attempt.at.millis() - ATTEMPTS_KEPT_FOR_MILLIS).max(0) as u64,
        0,
    ));
    connection
        .prepare_cached("DELETE FROM webhook_attempts WHERE webhook_id = ?1 AND id < ?2")
        .and_then(|mut statement| statement.execute(params![webhook_id, oldest_kept.to_string()]))
        .map_err(unavailable)?;
    let health_update = match health {
        EndpointHealth::Healthy => connection
            .prepare_cached("UPDATE webhooks SET failing_since = NULL WHERE id = ?1 AND failing_since IS NOT NULL")
            .and_then(|mut statement| statement.execute(params![webhook_id])),
        // Kept when set: an attempt made on an older read of the endpoint
        // never moves the start of its failures.
        EndpointHealth::FailingSince(since) => connection
            .prepare_cached("UPDATE webhooks SET failing_since = COALESCE(failing_since, ?2) WHERE id = ?1")
            .and_then(|mut statement| statement.execute(params![webhook_id, since.millis()])),
        EndpointHealth::Disable => connection
            .prepare_cached("UPDATE webhooks SET status = 'disabled' WHERE id = ?1")
            .and_then(|mut statement| statement.execute(params![webhook_id]))
            .and_then(|_| connection.execute("DELETE FROM webhook_outbox WHERE webhook_id = ?1", params![webhook_id])),
    };
    health_update.map_err(unavailable)?;
    Ok(())
}

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn create_webhook(&self, endpoint: &WebhookEndpoint, max_per_owner: usize) -> Result<bool, StoreError> {
        let endpoint = endpoint.clone();
        let events =
            serde_json::to_string(&endpoint.events.names()).map_err(|error| StoreError::Defect(error.to_string()))?;
        let previous = previous_secrets_json(&endpoint.previous_secrets)?;
        self.write(move |transaction, _| {
            let count: i64 = transaction
                .query_row("SELECT COUNT(*) FROM webhooks WHERE owner = ?1", params![endpoint.owner.as_str()], |row| {
                    row.get(0)
                })
                .map_err(unavailable)?;
            if count >= max_per_owner as i64 {
                return Ok(false);
            }
            transaction
                .execute(
                    &format!(
                        "INSERT INTO webhooks ({ENDPOINT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                    ),
                    params![
                        endpoint.id.to_string(),
                        endpoint.owner.as_str(),
                        endpoint.url,
                        events,
                        endpoint.description,
                        endpoint.status.as_str(),
                        endpoint.created_at.millis(),
                        endpoint.secret.expose(),
                        previous,
                        endpoint.failing_since.map(Timestamp::millis)
                    ],
                )
                .map_err(unavailable)?;
            Ok(true)
        })
        .await
    }

    async fn get_webhook(&self, owner: &Owner, id: WebhookId) -> Result<Option<WebhookEndpoint>, StoreError> {
        let owner = owner.clone();
        self.read(move |connection| {
            Ok(find_endpoint(connection, &id.to_string())?.filter(|endpoint| endpoint.owner == owner))
        })
        .await
    }

    async fn list_webhooks(
        &self,
        owner: &Owner,
        before: Option<WebhookId>,
        limit: u32,
    ) -> Result<Page<WebhookEndpoint>, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            let before = before.map_or_else(|| "wh_~".to_owned(), |id| id.to_string());
            let rows = connection
                .prepare_cached(&format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM webhooks WHERE owner = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3"
                ))
                .and_then(|mut statement| {
                    statement
                        .query_map(params![owner, before, i64::from(limit) + 1], endpoint_from_row)?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(unavailable)?;
            let has_more = rows.len() > limit as usize;
            let items = rows.into_iter().take(limit as usize).map(EndpointRow::decode).collect::<Result<_, _>>()?;
            Ok(Page { items, has_more })
        })
        .await
    }

    async fn delete_webhook(&self, owner: &Owner, id: WebhookId) -> Result<bool, StoreError> {
        let owner = owner.to_string();
        self.write(move |transaction, _| {
            let id = id.to_string();
            let deleted = transaction
                .execute("DELETE FROM webhooks WHERE id = ?1 AND owner = ?2", params![id, owner])
                .map_err(unavailable)?;
            if deleted > 0 {
                for table in ["webhook_outbox", "webhook_attempts"] {
                    transaction
                        .execute(&format!("DELETE FROM {table} WHERE webhook_id = ?1"), params![id])
                        .map_err(unavailable)?;
                }
            }
            Ok(deleted > 0)
        })
        .await
    }

    async fn rotate_webhook_secret(
        &self,
        endpoint: &WebhookEndpoint,
        replaced: &WebhookSecret,
    ) -> Result<bool, StoreError> {
        let previous = previous_secrets_json(&endpoint.previous_secrets)?;
        let (id, owner, secret, replaced) =
            (endpoint.id.to_string(), endpoint.owner.to_string(), endpoint.secret.expose(), replaced.expose());
        self.write(move |connection, _| {
            let changed = connection
                .execute(
                    "UPDATE webhooks SET secret = ?1, previous_secrets = ?2
                     WHERE id = ?3 AND owner = ?4 AND secret = ?5",
                    params![secret, previous, id, owner, replaced],
                )
                .map_err(unavailable)?;
            Ok(changed == 1)
        })
        .await
    }

    async fn deliveries(
        &self,
        owner: &Owner,
        id: WebhookId,
        before: Option<DeliveryId>,
        limit: u32,
    ) -> Result<Page<DeliveryAttempt>, StoreError> {
        let owner = owner.to_string();
        self.read(move |connection| {
            let before = before.map_or_else(|| "dlv_~".to_owned(), |id| id.to_string());
            let rows = connection
                .prepare_cached(
                    "SELECT webhook_attempts.id, event_id, type, attempt, http_status, error, duration_ms, at
                     FROM webhook_attempts JOIN webhooks ON webhooks.id = webhook_attempts.webhook_id
                     WHERE webhooks.id = ?1 AND webhooks.owner = ?2 AND webhook_attempts.id < ?3
                     ORDER BY webhook_attempts.id DESC LIMIT ?4",
                )
                .and_then(|mut statement| {
                    statement
                        .query_map(params![id.to_string(), owner, before, i64::from(limit) + 1], |row| {
                            Ok((
                                row.get::<_, String>(0)?,
                                row.get::<_, String>(1)?,
                                row.get::<_, String>(2)?,
                                row.get::<_, u32>(3)?,
                                row.get::<_, Option<u16>>(4)?,
                                row.get::<_, Option<String>>(5)?,
                                row.get::<_, i64>(6)?,
                                row.get::<_, i64>(7)?,
                            ))
                        })?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(unavailable)?;
            let has_more = rows.len() > limit as usize;
            let items = rows
                .into_iter()
                .take(limit as usize)
                .map(|(attempt_id, event_id, event_type, attempt, http_status, error, duration_ms, at)| {
                    Ok(DeliveryAttempt {
                        id: attempt_id.parse().map_err(|_| defect("attempt id"))?,
                        webhook_id: id,
                        event_id,
                        event_type,
                        attempt,
                        http_status,
                        error,
                        duration_ms: duration_ms.max(0) as u64,
                        at: Timestamp::from_millis(at),
                    })
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(Page { items, has_more })
        })
        .await
    }

    async fn record_attempt(
        &self,
        _owner: &Owner,
        attempt: &DeliveryAttempt,
        health: EndpointHealth,
    ) -> Result<(), StoreError> {
        let attempt = attempt.clone();
        self.write(move |transaction, _| record(transaction, &attempt, health)).await
    }
}

impl SqliteStore {
    pub(super) fn signal_deliveries_queued(&self) {
        self.inner.deliveries_queued.notify_one();
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    async fn deliveries_queued(&self) {
        self.inner.deliveries_queued.notified().await;
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        skip: &DueSkip,
        per_endpoint: u32,
    ) -> Result<Vec<PendingDelivery>, StoreError> {
        let skip = skip.clone();
        self.read(move |connection| {
            // The endpoints with something due, the one waiting longest
            // first: one probe of the outbox's index per enabled endpoint.
            let endpoints = connection
                .prepare_cached(&format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM (
                         SELECT *, (SELECT MIN(next_attempt_at) FROM webhook_outbox
                                    WHERE webhook_id = webhooks.id) AS oldest
                         FROM webhooks WHERE status = 'enabled')
                     WHERE oldest <= ?1 ORDER BY oldest"
                ))
                .and_then(|mut statement| {
                    statement.query_map(params![now.millis()], endpoint_from_row)?.collect::<Result<Vec<_>, _>>()
                })
                .map_err(unavailable)?;
            let mut due = Vec::new();
            let mut statement = connection
                .prepare_cached(
                    &format!("SELECT webhook_outbox.id, webhook_outbox.run_id, webhook_outbox.attempts, {EVENT_COLUMNS}
                     FROM webhook_outbox
                     JOIN run_events ON run_events.run_id = webhook_outbox.run_id
                                    AND run_events.seq = webhook_outbox.seq
                     WHERE webhook_outbox.webhook_id = ?1 AND webhook_outbox.next_attempt_at <= ?2
                     ORDER BY webhook_outbox.next_attempt_at, webhook_outbox.id LIMIT ?3"),
                )
                .map_err(unavailable)?;
            for row in endpoints {
                // An endpoint that cannot be read is left out, never a
                // reason to hold up the others.
                let id = row.id.clone();
                let endpoint = match row.decode() {
                    Ok(endpoint) => endpoint,
                    Err(error) => {
                        tracing::error!(webhook_id = id, %error, "a webhook endpoint cannot be read; its deliveries wait");
                        continue;
                    }
                };
                if skip.endpoints.contains(&endpoint.id) || skip.owners.contains(&endpoint.owner) {
                    continue;
                }
                let rows = statement
                    .query_map(params![id, now.millis(), per_endpoint], |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                            event_row(row, 3)?,
                        ))
                    })
                    .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                    .map_err(unavailable)?;
                for (outbox_id, run_id, attempts, event) in rows {
                    let Ok(run_id) = run_id.parse() else {
                        tracing::error!(outbox_id, "an outbox row names a malformed run id; left out");
                        continue;
                    };
                    due.push(PendingDelivery {
                        place: outbox_id,
                        endpoint: endpoint.clone(),
                        run_id,
                        event: event.into(),
                        attempts: attempts.clamp(0, i64::from(u32::MAX)) as u32,
                    });
                }
            }
            Ok(due)
        })
        .await
    }

    async fn hold_delivery(&self, delivery: &PendingDelivery, until: Timestamp) -> Result<(), StoreError> {
        let (id, webhook_id, attempts) = (delivery.place, delivery.endpoint.id.to_string(), delivery.attempts);
        self.write(move |transaction, _| {
            // Not once the run's second event is in: it may have committed
            // since the engine looked, and its wake found nothing to wake.
            transaction
                .execute(
                    "UPDATE webhook_outbox SET next_attempt_at = ?4
                     WHERE id = ?1 AND webhook_id = ?2 AND attempts = ?3
                       AND NOT EXISTS (SELECT 1 FROM run_events
                                       WHERE run_id = webhook_outbox.run_id AND seq = 2)",
                    params![id, webhook_id, attempts, until.millis()],
                )
                .map_err(unavailable)?;
            Ok(())
        })
        .await
    }

    async fn finish_delivery(
        &self,
        delivery: &PendingDelivery,
        attempt: &DeliveryAttempt,
        health: EndpointHealth,
        retry_at: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        let (id, attempts, attempt) = (delivery.place, delivery.attempts, attempt.clone());
        self.write(move |transaction, _| {
            // The endpoint may have been deleted while the attempt was made.
            if find_endpoint(transaction, &attempt.webhook_id.to_string())?.is_some() {
                record(transaction, &attempt, health)?;
            }
            // Only the row as it was read (ids are never reused, and its
            // attempts have not moved on): a row removed meanwhile (its
            // endpoint disabled or deleted) stays removed.
            let webhook_id = attempt.webhook_id.to_string();
            match retry_at {
                Some(at) => transaction.execute(
                    "UPDATE webhook_outbox SET attempts = ?4, next_attempt_at = ?5
                     WHERE id = ?1 AND webhook_id = ?2 AND attempts = ?3",
                    params![id, webhook_id, attempts, attempt.attempt, at.millis()],
                ),
                None => transaction.execute(
                    "DELETE FROM webhook_outbox WHERE id = ?1 AND webhook_id = ?2 AND attempts = ?3",
                    params![id, webhook_id, attempts],
                ),
            }
            .map_err(unavailable)?;
            Ok(())
        })
        .await
    }
}
