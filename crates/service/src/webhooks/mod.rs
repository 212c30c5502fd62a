//! Delivering events to webhook endpoints: one signed attempt
//! ([`Deliverer::attempt`]) and what becomes of a delivery
//! ([`WebhookEngine`]), the same on every way of running; the queues that
//! feed the engine: the embedded server's outbox ([`OutboxWorker`]) and,
//! on AWS, the stream notifier and the delivery queue (`agent_runs_lambda`).

mod engine;
mod outbox_worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::{MetricsSink, Observation};
use agent_runs_agents::public_network;
use agent_runs_domain::{
    AttemptOutcome, Clock, DELIVERY_TIMEOUT, DeliveryAttempt, DeliveryId, EndpointHealth, EventId, IdGenerator,
    RETRY_DELAYS, RunId, Timestamp, WebhookEndpoint, delivery_body, retry_delay,
};
use agent_runs_ports::store::StoredEvent;
use agent_runs_ports::views::{EventView, ExtraFields};

pub use engine::{CREATE_SETTLED_AFTER, Delivered, DeliveryError, DeliveryQueue, EARLY_ENOUGH, Held, WebhookEngine};
pub use outbox_worker::{OutboxQueue, OutboxWorker};

/// The most of an error text an attempt keeps.
const ERROR_CHARS: usize = 200;

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct DeliveryPolicy {
    /// `AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE=true`: `http` URLs and private,
    /// loopback and link-local addresses allowed (local development, tests).
    pub allow_private: bool,
    /// The waits between attempts ([`RETRY_DELAYS`]; shorter in tests).
    pub retry_delays: Vec<Duration>,
    pub timeout: Duration,
    /// Deliveries in flight to one endpoint at most, so that a slow
    /// receiver holds up only its own.
    pub per_endpoint_concurrency: usize,
    /// Deliveries in flight to one owner's endpoints at most, so that one
    /// owner's slow endpoints cannot take every slot.
    pub per_owner_concurrency: usize,
    /// Deliveries in flight at most, all endpoints together.
    pub concurrency: usize,
}

impl DeliveryPolicy {
    pub fn new(allow_private: bool) -> Self {
        DeliveryPolicy {
            allow_private,
            retry_delays: RETRY_DELAYS.to_vec(),
            timeout: DELIVERY_TIMEOUT,
            per_endpoint_concurrency: 4,
            per_owner_concurrency: 16,
            concurrency: 64,
        }
    }
}

/// One attempt's result: what `deliveries` shows, what it does to the
/// endpoint, and when to try again (`None`: delivered, or given up).
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub attempt: DeliveryAttempt,
    pub health: EndpointHealth,
    pub retry_at: Option<Timestamp>,
}

/// Signs and sends events to endpoints.
#[derive(Clone)]
pub struct Deliverer {
    client: reqwest::Client,
    policy: DeliveryPolicy,
    clock: Arc<dyn Clock>,
    ids: Arc<IdGenerator>,
    metrics: Option<Arc<dyn MetricsSink>>,
    shown: ExtraFields,
}

impl Deliverer {
    pub fn new(policy: DeliveryPolicy, clock: Arc<dyn Clock>) -> Self {
        // Redirects are never followed: the signature and the event go to
        // the URL the owner registered, nowhere else. Without private
        // addresses, names resolve to public ones only and no proxy is
        // used (a proxy would resolve the name out of sight of the check).
        let timeout = policy.timeout;
        let client = agent_runs_agents::llm::build_client(|builder| {
            let builder = builder.redirect(reqwest::redirect::Policy::none()).timeout(timeout).connect_timeout(timeout);
            if policy.allow_private {
                builder
            } else {
                builder.no_proxy().dns_resolver(Arc::new(public_network::PublicAddressResolver))
            }
        });
        Deliverer {
            client,
            policy,
            clock,
            ids: Arc::new(IdGenerator::default()),
            metrics: None,
            shown: ExtraFields::default(),
        }
    }

    /// Renders events as this deployment shows them.
    pub fn showing(self, shown: ExtraFields) -> Self {
        Deliverer { shown, ..self }
    }

    /// Counts each attempt's outcome there.
    pub fn with_metrics(self, sink: Arc<dyn MetricsSink>) -> Self {
        Deliverer { metrics: Some(sink), ..self }
    }

    pub fn policy(&self) -> &DeliveryPolicy {
        &self.policy
    }

    /// Makes attempt number `number` (from 1) to deliver `event` of
    /// `run_id` to `endpoint`.
    pub async fn attempt(
        &self,
        endpoint: &WebhookEndpoint,
        run_id: RunId,
        event: &StoredEvent,
        number: u32,
    ) -> AttemptResult {
        let event_id = EventId::of_event(run_id, event.seq, event.at).to_string();
        let started = Instant::now();
        let (http_status, error) = match self.send(endpoint, run_id, event, &event_id).await {
            Ok(status) if (200..300).contains(&status) => (Some(status), None),
            Ok(status) => (Some(status), Some(format!("the endpoint answered HTTP {status}"))),
            Err(error) => (None, Some(error)),
        };
        let at = self.clock.now();
        let outcome = AttemptOutcome::of_status(http_status);
        if let Some(metrics) = &self.metrics {
            metrics.record(&[Observation::WebhookAttempt { outcome }]);
        }
        let health = endpoint.after_attempt(outcome, at);
        let retry_at = match (outcome, health) {
            (AttemptOutcome::Failed, EndpointHealth::FailingSince(_)) => {
                retry_delay(&self.policy.retry_delays, number, rand::random_range(-1.0..=1.0))
                    .map(|delay| at.plus(delay))
            }
            _ => None,
        };
        let attempt = DeliveryAttempt {
            id: DeliveryId::from_ulid(self.ids.ulid_at(at)),
            webhook_id: endpoint.id,
            event_id,
            event_type: event.kind.clone(),
            attempt: number,
            http_status,
            error,
            duration_ms: started.elapsed().as_millis().min(u128::from(u64::MAX)) as u64,
            at,
        };
        AttemptResult { attempt, health, retry_at }
    }

    /// The status the endpoint answered, or why there was none.
    async fn send(
        &self,
        endpoint: &WebhookEndpoint,
        run_id: RunId,
        event: &StoredEvent,
        event_id: &str,
    ) -> Result<u16, String> {
        if let Err(problem) = check_url(&endpoint.url, self.policy.allow_private) {
            return Err(problem.to_owned());
        }
        let data = event.data_json(self.shown).map_err(|_| "the event could not be read".to_owned())?;
        let view = EventView::of(run_id, event.seq, &event.kind, event.at, &data)
            .map_err(|_| "the event could not be read".to_owned())?;
        let event_json = serde_json::to_string(&view).map_err(|_| "the event could not be read".to_owned())?;
        let body = delivery_body(&event.kind, event.at, &event_json);
        let now = self.clock.now();
        let timestamp = now.millis().div_euclid(1000);
        let signature = endpoint.signature(event_id, timestamp, body.as_bytes(), now);
        let response = self
            .client
            .post(&endpoint.url)
            .header("content-type", "application/json")
            .header("webhook-id", event_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|error| describe(&error))?;
        Ok(response.status().as_u16())
    }
}

/// Why a URL may not receive deliveries, checked when an endpoint is
/// created and again before every attempt (a name is also checked on what
/// it resolves to, as the connection is made).
pub fn check_url(url: &str, allow_private: bool) -> Result<(), &'static str> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "the URL is not a valid absolute URL")?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => return Err("the URL must use https"),
        _ => return Err("the URL must use https (http only where private addresses are allowed)"),
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host");
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("the URL must not carry a user name or password");
    }
    if !allow_private && public_network::check_url(url).is_err() {
        return Err("the URL's host is a loopback, private, link-local or otherwise non-public address");
    }
    Ok(())
}

/// A delivery error as an owner may see it: what went wrong, never the
/// internals of the client.
fn describe(error: &reqwest::Error) -> String {
    let not_public = std::iter::successors(Some(error as &dyn std::error::Error), |error| error.source())
        .any(|error| error.downcast_ref::<public_network::NotPublic>().is_some());
    let text = if not_public {
        "the endpoint's host resolves to a loopback, private, link-local or otherwise non-public address".to_owned()
    } else if error.is_timeout() {
        "the endpoint did not answer in time".to_owned()
    } else if error.is_connect() {
        "could not connect to the endpoint".to_owned()
    } else if error.is_redirect() {
        "the endpoint redirected; redirects are not followed".to_owned()
    } else {
        "the request to the endpoint failed".to_owned()
    };
    text.chars().take(ERROR_CHARS).collect()
}
