//! Webhook endpoints and their deliveries, following the Standard Webhooks
//! specification (standardwebhooks.com): what an endpoint subscribes to,
//! its signing secrets, how a delivery is signed, and when a failed one is
//! tried again.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::event::EVENT_TYPES;
use crate::ids::{DeliveryId, Owner, WebhookId};
use crate::time::Timestamp;

/// Endpoints one owner may have.
pub const MAX_WEBHOOKS_PER_OWNER: usize = 20;
/// The longest endpoint URL accepted.
pub const MAX_WEBHOOK_URL_BYTES: usize = 2_048;
pub const MAX_WEBHOOK_DESCRIPTION_CHARS: usize = 500;
/// After a rotation, the old secret keeps signing for this long.
pub const PREVIOUS_SECRET_VALID_FOR: Duration = Duration::from_secs(24 * 60 * 60);
/// Replaced secrets kept signing at once, at most (rotations within a day).
pub const MAX_PREVIOUS_SECRETS: usize = 5;
/// An endpoint whose every attempt failed for this long is disabled.
pub const DISABLE_AFTER_FAILING_FOR: Duration = Duration::from_secs(5 * 24 * 60 * 60);
/// A receiver has this long to answer a delivery.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(15);

const SECRET_PREFIX: &str = "whsec_";
const SECRET_BYTES: usize = 32;

/// The waits before each retry of a failed delivery: 9 attempts over about
/// 38 hours (more than the 24 the contract asks), each wait jittered by up
/// to ±20 % so that many failures do not come back at once.
pub const RETRY_DELAYS: [Duration; 8] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 60 * 60),
    Duration::from_secs(5 * 60 * 60),
    Duration::from_secs(10 * 60 * 60),
    Duration::from_secs(10 * 60 * 60),
    Duration::from_secs(10 * 60 * 60),
];

/// The wait after failed attempt number `attempt` (from 1), or `None` when
/// it was the last. `jitter` is a number from -1.0 to 1.0.
pub fn retry_delay(delays: &[Duration], attempt: u32, jitter: f64) -> Option<Duration> {
    let base = *delays.get(usize::try_from(attempt).ok()?.checked_sub(1)?)?;
    Some(base.mul_f64(1.0 + 0.2 * jitter.clamp(-1.0, 1.0)))
}

/// Which events an endpoint receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventFilter {
    /// `["*"]`: every event.
    All,
    /// Those types, each a known event type, no repeats.
    Types(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventFilterError {
    #[error("`events` must name at least one event type, or be [\"*\"] for all of them.")]
    Empty,
    #[error("`events` names {0:?}, which is not an event type. Known types: {types}.", types = EVENT_TYPES.join(", "))]
    Unknown(String),
    #[error("`events` names {0:?} twice.")]
    Repeated(String),
    #[error("`events`: \"*\" (every event) cannot be combined with event types.")]
    WildcardWithTypes,
}

impl EventFilter {
    pub fn parse(types: Vec<String>) -> Result<Self, EventFilterError> {
        if types.is_empty() {
            return Err(EventFilterError::Empty);
        }
        if types.iter().any(|kind| kind == "*") {
            return if types.len() == 1 { Ok(EventFilter::All) } else { Err(EventFilterError::WildcardWithTypes) };
        }
        for (index, kind) in types.iter().enumerate() {
            if !EVENT_TYPES.contains(&kind.as_str()) {
                return Err(EventFilterError::Unknown(kind.clone()));
            }
            if types[..index].contains(kind) {
                return Err(EventFilterError::Repeated(kind.clone()));
            }
        }
        Ok(EventFilter::Types(types))
    }

    pub fn wants(&self, event_type: &str) -> bool {
        match self {
            EventFilter::All => true,
            EventFilter::Types(types) => types.iter().any(|kind| kind == event_type),
        }
    }

    /// A filter as a store kept it, not checked against today's event
    /// types: a type that no longer exists matches nothing, and the
    /// endpoint keeps working for the others.
    pub fn stored(types: Vec<String>) -> Self {
        if types.len() == 1 && types[0] == "*" { EventFilter::All } else { EventFilter::Types(types) }
    }

    /// As the API shows it and the stores keep it.
    pub fn names(&self) -> Vec<String> {
        match self {
            EventFilter::All => vec!["*".to_owned()],
            EventFilter::Types(types) => types.clone(),
        }
    }
}

/// A signing secret: 32 random bytes, written `whsec_<base64>`.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

impl WebhookSecret {
    pub fn generate() -> Self {
        WebhookSecret(rand::random())
    }

    pub fn parse(text: &str) -> Option<Self> {
        let bytes = STANDARD.decode(text.strip_prefix(SECRET_PREFIX)?).ok()?;
        Some(WebhookSecret(bytes.try_into().ok()?))
    }

    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(self.0))
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    pub fn sign(&self, message_id: &str, timestamp_secs: i64, body: &[u8]) -> String {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.0);
        let mut context = ring::hmac::Context::with_key(&key);
        context.update(message_id.as_bytes());
        context.update(format!(".{timestamp_secs}.").as_bytes());
        context.update(body);
        format!("v1,{}", STANDARD.encode(context.sign().as_ref()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookStatus {
    Enabled,
    /// By a `410 Gone`, or after failing every attempt for five days.
    Disabled,
}

impl WebhookStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookStatus::Enabled => "enabled",
            WebhookStatus::Disabled => "disabled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [WebhookStatus::Enabled, WebhookStatus::Disabled].into_iter().find(|status| status.as_str() == text)
    }
}

/// A secret replaced by a rotation, still signing until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousSecret {
    pub secret: WebhookSecret,
    pub until: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    pub id: WebhookId,
    pub owner: Owner,
    pub url: String,
    pub events: EventFilter,
    pub description: Option<String>,
    pub status: WebhookStatus,
    pub created_at: Timestamp,
    pub secret: WebhookSecret,
    /// Secrets replaced by rotations, newest first, each signing until its
    /// `until`.
    pub previous_secrets: Vec<PreviousSecret>,
    /// When the first of the failed attempts since the last success was
    /// made; `None` while deliveries succeed.
    pub failing_since: Option<Timestamp>,
}

impl WebhookEndpoint {
    /// The `webhook-signature` header: a signature with the secret, and
    /// one with each replaced secret still valid (the specification lets
    /// receivers accept any of several, space-separated).
    pub fn signature(&self, message_id: &str, timestamp_secs: i64, body: &[u8], now: Timestamp) -> String {
        let mut header = self.secret.sign(message_id, timestamp_secs, body);
        for previous in self.previous_secrets.iter().filter(|previous| now < previous.until) {
            header.push(' ');
            header.push_str(&previous.secret.sign(message_id, timestamp_secs, body));
        }
        header
    }

    /// A new secret; the current one keeps signing for a day (as do those
    /// replaced earlier, until their own day is over).
    pub fn rotate_secret(&mut self, now: Timestamp) {
        let replaced = std::mem::replace(&mut self.secret, WebhookSecret::generate());
        self.previous_secrets.retain(|previous| now < previous.until);
        self.previous_secrets
            .insert(0, PreviousSecret { secret: replaced, until: now.plus(PREVIOUS_SECRET_VALID_FOR) });
        self.previous_secrets.truncate(MAX_PREVIOUS_SECRETS);
    }

    /// What an attempt's outcome does to the endpoint.
    pub fn after_attempt(&self, outcome: AttemptOutcome, at: Timestamp) -> EndpointHealth {
        match outcome {
            AttemptOutcome::Delivered => EndpointHealth::Healthy,
            AttemptOutcome::Gone => EndpointHealth::Disable,
            AttemptOutcome::Failed => {
                let since = self.failing_since.unwrap_or(at);
                if at.since(since) >= DISABLE_AFTER_FAILING_FOR {
                    EndpointHealth::Disable
                } else {
                    EndpointHealth::FailingSince(since)
                }
            }
        }
    }
}

/// What one delivery attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// A 2xx answer.
    Delivered,
    /// `410 Gone`: the receiver wants no more deliveries.
    Gone,
    /// Any other answer, or none.
    Failed,
}

impl AttemptOutcome {
    pub fn of_status(status: Option<u16>) -> Self {
        match status {
            Some(200..=299) => AttemptOutcome::Delivered,
            Some(410) => AttemptOutcome::Gone,
            _ => AttemptOutcome::Failed,
        }
    }
}

/// An endpoint's state after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointHealth {
    Healthy,
    FailingSince(Timestamp),
    Disable,
}

/// One attempt to deliver an event to an endpoint, as `deliveries` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryAttempt {
    pub id: DeliveryId,
    pub webhook_id: WebhookId,
    pub event_id: String,
    pub event_type: String,
    /// From 1.
    pub attempt: u32,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: u64,
    pub at: Timestamp,
}

/// The body of a delivery: `{"type", "timestamp", "data": <the event>}`.
pub fn delivery_body(event_type: &str, event_created_at: Timestamp, event_json: &str) -> String {
    format!(
        "{{\"type\":{},\"timestamp\":\"{}\",\"data\":{event_json}}}",
        serde_json::Value::from(event_type),
        event_created_at.to_rfc3339()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_over_id_timestamp_and_body() {
        // Computed apart: Python's hmac over the same bytes.
        let secret = WebhookSecret([7; 32]);
        let signature = secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#);
        assert_eq!(signature, "v1,YO/ulmd+VFtlnbodv7yLOOsS6RlBZ48h++gXZrGOpZo=");
    }

    #[test]
    fn secrets_round_trip_and_never_show_in_debug() {
        let secret = WebhookSecret::generate();
        let text = secret.expose();
        assert!(text.starts_with("whsec_"));
        assert_eq!(WebhookSecret::parse(&text), Some(secret.clone()));
        assert_ne!(WebhookSecret::generate(), secret);
        assert_eq!(format!("{secret:?}"), "WebhookSecret(..)");
        assert_eq!(WebhookSecret::parse("whsec_!!"), None);
        assert_eq!(WebhookSecret::parse(&text[6..]), None);
    }

    #[test]
    fn filters_take_known_types_or_the_wildcard_alone() {
        let types = |names: &[&str]| names.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
        assert_eq!(EventFilter::parse(types(&["*"])), Ok(EventFilter::All));
        let filter = EventFilter::parse(types(&["run.succeeded", "run.awaiting_approval"])).unwrap();
        assert!(filter.wants("run.succeeded") && !filter.wants("run.failed"));
        assert!(EventFilter::All.wants("tool.completed"));
        assert_eq!(EventFilter::parse(vec![]), Err(EventFilterError::Empty));
        assert_eq!(EventFilter::parse(types(&["run.done"])), Err(EventFilterError::Unknown("run.done".into())));
        assert_eq!(
            EventFilter::parse(types(&["run.failed", "run.failed"])),
            Err(EventFilterError::Repeated("run.failed".into()))
        );
        assert_eq!(EventFilter::parse(types(&["*", "run.failed"])), Err(EventFilterError::WildcardWithTypes));
    }

    #[test]
    fn retries_grow_over_more_than_a_day_with_bounded_jitter() {
        let total: Duration = RETRY_DELAYS.iter().map(|delay| delay.mul_f64(0.8)).sum();
        assert!(total >= Duration::from_secs(24 * 60 * 60), "{total:?}");
        assert!(RETRY_DELAYS.len() + 1 >= 8);
        assert_eq!(retry_delay(&RETRY_DELAYS, 1, 0.0), Some(Duration::from_secs(5)));
        assert_eq!(retry_delay(&RETRY_DELAYS, 1, 1.0), Some(Duration::from_secs(6)));
        assert_eq!(retry_delay(&RETRY_DELAYS, 2, -1.0), Some(Duration::from_secs(240)));
        assert_eq!(retry_delay(&RETRY_DELAYS, 9, 0.0), None);
        assert_eq!(retry_delay(&RETRY_DELAYS, 0, 0.0), None);
    }

    fn endpoint(now: Timestamp) -> WebhookEndpoint {
        WebhookEndpoint {
            id: WebhookId::from_ulid(ulid::Ulid::new()),
            owner: Owner::parse("acme").unwrap(),
            url: "https://example.com/hook".into(),
            events: EventFilter::All,
            description: None,
            status: WebhookStatus::Enabled,
            created_at: now,
            secret: WebhookSecret::generate(),
            previous_secrets: Vec::new(),
            failing_since: None,
        }
    }

    #[test]
    fn a_rotated_secret_signs_beside_the_new_one_for_a_day() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let mut endpoint = endpoint(now);
        let first = endpoint.secret.clone();
        endpoint.rotate_secret(now);
        let sign = |secret: &WebhookSecret| secret.sign("evt_1", 1, b"{}");
        let header = endpoint.signature("evt_1", 1, b"{}", now);
        assert_eq!(header.split(' ').collect::<Vec<_>>(), [sign(&endpoint.secret), sign(&first)]);
        // A second rotation within the day: all three sign, each old one
        // for its own day.
        let second = endpoint.secret.clone();
        let hour_later = now.plus(Duration::from_secs(3_600));
        endpoint.rotate_secret(hour_later);
        let header = endpoint.signature("evt_1", 1, b"{}", hour_later);
        assert_eq!(header.split(' ').collect::<Vec<_>>(), [sign(&endpoint.secret), sign(&second), sign(&first)]);
        let day_later = now.plus(PREVIOUS_SECRET_VALID_FOR);
        let header = endpoint.signature("evt_1", 1, b"{}", day_later);
        assert_eq!(header.split(' ').collect::<Vec<_>>(), [sign(&endpoint.secret), sign(&second)]);
        let much_later = hour_later.plus(PREVIOUS_SECRET_VALID_FOR);
        assert_eq!(endpoint.signature("evt_1", 1, b"{}", much_later), sign(&endpoint.secret));
        for _ in 0..10 {
            endpoint.rotate_secret(much_later);
        }
        assert_eq!(endpoint.previous_secrets.len(), MAX_PREVIOUS_SECRETS);
    }

    #[test]
    fn an_endpoint_is_disabled_by_gone_or_five_days_of_failures() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let mut endpoint = endpoint(now);
        assert_eq!(endpoint.after_attempt(AttemptOutcome::Failed, now), EndpointHealth::FailingSince(now));
        endpoint.failing_since = Some(now);
        let almost = now.plus(DISABLE_AFTER_FAILING_FOR - Duration::from_millis(1));
        assert_eq!(endpoint.after_attempt(AttemptOutcome::Failed, almost), EndpointHealth::FailingSince(now));
        let five_days = now.plus(DISABLE_AFTER_FAILING_FOR);
        assert_eq!(endpoint.after_attempt(AttemptOutcome::Failed, five_days), EndpointHealth::Disable);
        assert_eq!(endpoint.after_attempt(AttemptOutcome::Delivered, five_days), EndpointHealth::Healthy);
        assert_eq!(endpoint.after_attempt(AttemptOutcome::Gone, now), EndpointHealth::Disable);
        assert_eq!(AttemptOutcome::of_status(Some(204)), AttemptOutcome::Delivered);
        assert_eq!(AttemptOutcome::of_status(Some(301)), AttemptOutcome::Failed);
        assert_eq!(AttemptOutcome::of_status(Some(410)), AttemptOutcome::Gone);
        assert_eq!(AttemptOutcome::of_status(None), AttemptOutcome::Failed);
    }

    #[test]
    fn the_body_wraps_the_event() {
        let body = delivery_body("run.failed", Timestamp::from_millis(0), r#"{"id":"evt_x"}"#);
        assert_eq!(body, r#"{"type":"run.failed","timestamp":"1970-01-01T00:00:00.000Z","data":{"id":"evt_x"}}"#);
    }
}
