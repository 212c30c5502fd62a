//! The ports to persistence: runs with their events, idempotency records
//! and API keys.

mod agent_record;
mod change;
mod event_record;
mod layer;
mod policy_record;
pub mod record;

use async_trait::async_trait;

use crate::views::ExtraFields;

use agent_runs_domain::{
    AgentDefinition, ApprovalKind, ApprovalStatus, DecidedCall, DeliveryAttempt, DeliveryId, EndpointHealth,
    InboxPosition, KeyId, Owner, Policy, PreviousSecret, Rule, RunId, RunStatus, Scopes, Timestamp, WebhookEndpoint,
    WebhookId, WebhookSecret,
};

pub use agent_record::{decode_agent, encode_agent};
pub use agent_runs_domain::{InboxEntry, Run};
pub use change::{CHANGE_ATTEMPTS, ChangeError, Transition, change_run, change_run_if, conflict_backoff};
pub use event_record::{EVENT_FORMAT, EventBody, EventFormat, RENDERED_FORMAT};
pub use layer::{Answer, Call, Hooks, Layered};
pub use policy_record::{decode_policy, encode_policy};

/// The largest checkpoint a store keeps: what fits in a DynamoDB item of
/// its own (the embedded store holds itself to the same).
pub const MAX_CHECKPOINT_BYTES: usize = 350_000;

/// An owner's runs not yet ended, unless `AGENT_RUNS_MAX_ACTIVE_RUNS` says otherwise.
pub const DEFAULT_MAX_ACTIVE_RUNS: u32 = 1_000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A conditional write lost a race: the item changed since it was read.
    #[error("the item changed since it was read")]
    Conflict,
    /// The database could not be reached or is overloaded; safe to retry.
    /// A write may have landed all the same (a timeout).
    #[error("the store is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The write surely did not happen: the database turned it away each
    /// time it was sent (throttling, conflicts), or a call it depends on
    /// failed before it was sent. Safe to retry.
    #[error("the store refused the write")]
    Refused(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Data that cannot be read back, or a bug.
    #[error("store defect: {0}")]
    Defect(String),
}

/// The owner and id that address a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunKey {
    pub owner: Owner,
    pub run_id: RunId,
}

/// A request to reserve an `Idempotency-Key` along with the run it creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyClaim {
    /// SHA-256 hex of the key (the raw key is never stored).
    pub key_hash: String,
    /// SHA-256 hex of the normalised request, to tell a replay from a reuse.
    pub request_hash: String,
    pub created_at: Timestamp,
    /// Records older than this are ignored and may be replaced.
    pub expires_at: Timestamp,
}

/// What an earlier request with the same `Idempotency-Key` created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub request_hash: String,
    pub run_id: RunId,
}

#[derive(Debug)]
pub enum InsertOutcome {
    Inserted,
    /// The idempotency key was taken by an earlier request; nothing was written.
    IdempotencyKeyTaken(IdempotencyRecord),
    /// The owner already has `max_active` runs that are not terminal.
    TooManyActiveRuns,
}

/// One page of a list: at most `limit` runs, and whether more matched.
#[derive(Debug)]
pub struct ListPage {
    pub runs: Vec<Run>,
    pub has_more: bool,
    /// Where the next page starts when it is not after the last run: a
    /// filtered read that stopped at its bound before filling the page.
    pub resume_after: Option<RunId>,
}

/// A page of a list as clients see it: each item's JSON, and where the
/// last is (where the next page starts): a run's id, unless said otherwise.
#[derive(Debug, Clone)]
pub struct ViewPage<Last = RunId> {
    pub views: Vec<std::sync::Arc<str>>,
    pub last: Option<Last>,
    pub has_more: bool,
}

/// A page of the approvals inbox as clients see it: each entry's JSON, and
/// the position of the last (where the next page starts).
pub type InboxViewPage = ViewPage<InboxPosition>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListRequest {
    pub status: Option<RunStatus>,
    /// Only the runs of this conversation (see [`Run::thread_id`]).
    pub thread: Option<RunId>,
    /// Only runs with an id lower than this (older); the keyset cursor.
    pub before: Option<RunId>,
    pub limit: u32,
}

/// Approvals across an owner's runs, newest `requested_at` first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboxRequest {
    pub status: ApprovalStatus,
    pub agent: Option<String>,
    /// Only approvals of this kind.
    pub kind: Option<ApprovalKind>,
    /// Only entries after this one (older); the keyset cursor.
    pub after: Option<InboxPosition>,
    pub limit: u32,
}

#[derive(Debug)]
pub struct InboxPage {
    pub entries: Vec<InboxEntry>,
    pub has_more: bool,
    /// Where the next page starts when the store stopped reading before the
    /// page was full (a filter it cannot ask its index for); else after the
    /// last entry.
    pub resume_after: Option<InboxPosition>,
}

/// A batch of run writes that stopped: the first `written` runs were stored
/// (and updated in the caller's slice), the rest were not.
#[derive(Debug, thiserror::Error)]
#[error("{error} (after {written} runs were written)")]
pub struct BatchWriteError {
    pub written: usize,
    #[source]
    pub error: StoreError,
}

/// What an [`Upkeep::settle_counts`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Items of counts checked.
    pub items: usize,
    /// Places given back.
    pub given_back: usize,
    /// It stopped at its deadline; the items left stay due.
    pub unfinished: bool,
}

/// A run whose `due_at` has come, for the sweeper; also its position for
/// paging through many of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueRun {
    pub due_at: Timestamp,
    pub key: RunKey,
}

/// An event as read from a store; its `data` is rendered for clients when
/// it is shown ([`StoredEvent::data_json`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub kind: String,
    pub at: Timestamp,
    pub data: EventBody,
}

impl StoredEvent {
    /// The event's `data` as clients get it from this deployment.
    pub fn data_json(&self, shown: ExtraFields) -> Result<std::borrow::Cow<'_, str>, StoreError> {
        self.data.render(&self.kind, shown)
    }
}

/// Events of one run, oldest first, and whether more exist after them.
#[derive(Debug)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    pub has_more: bool,
}

/// One run at a time: create, read and change it. Every write of a run
/// also writes its pending events (`Run::pending_events`) in the same
/// transaction, numbered after `Run::event_seq`, and on success leaves the
/// caller's run with them counted and cleared.
#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Writes a new run (and its idempotency record, if any) atomically.
    async fn insert(
        &self,
        run: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
        max_active: u32,
    ) -> Result<InsertOutcome, StoreError>;

    /// Undoes a create whose enqueue failed: removes the run, its events and
    /// its idempotency record, but only while the run is exactly as inserted
    /// (`queued`, version 0). `Ok(false)` when it has moved on: a worker
    /// claimed it (the send was delivered after all) or a replay of its
    /// `Idempotency-Key` answered `201` with it; it must then be kept.
    async fn undo_create(&self, run: &Run, idempotency_key_hash: Option<&str>) -> Result<bool, StoreError>;

    /// A strongly consistent read. An ended run comes without the
    /// checkpoint it ended with (only a run continuing it needs that).
    async fn get(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError>;

    /// [`RunStore::get`] with the checkpoint an ended run ended with, for a
    /// run that continues it to carry on from: one read where the store can.
    async fn get_to_continue(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError>;

    /// Replaces the run if its stored version is still `run.version` and the
    /// stored run is not terminal, then increments `run.version`.
    /// `Err(Conflict)` when another write came first. Terminal runs are never
    /// written again, so a write whose status is terminal is the one that
    /// ends the run (stores that count active runs rely on this).
    async fn update(&self, run: &mut Run) -> Result<(), StoreError>;

    /// [`RunStore::update`] of several runs, in one transaction where the
    /// store can: SQLite always; DynamoDB while the writes fit in one
    /// `TransactWriteItems` (100 items), else in several, in order, each of
    /// whole runs. On an error the first `written` runs are stored.
    async fn update_batch(&self, runs: &mut [Run]) -> Result<(), BatchWriteError>;
}

/// An owner's runs and approvals, in pages.
#[async_trait]
pub trait RunLists: Send + Sync + 'static {
    /// Newest first. Reads at most `limit + 1` runs to know whether more exist.
    async fn list(&self, owner: &Owner, request: ListRequest) -> Result<ListPage, StoreError>;

    /// [`RunLists::list`] as clients see each run (its JSON); a store that
    /// keeps each run's JSON answers without decoding and encoding every run,
    /// another answers with [`views_of`].
    async fn list_views(&self, owner: &Owner, request: ListRequest) -> Result<ViewPage, StoreError>;

    /// One of the owner's runs as clients see it (its JSON), as
    /// [`RunStore::get`] finds it; a store that keeps runs' JSON answers
    /// without copying and encoding the run.
    async fn run_json(&self, owner: &Owner, run_id: RunId) -> Result<Option<std::sync::Arc<str>>, StoreError>;

    /// The owner's approvals with the request's status (and agent), newest
    /// `requested_at` first, each as its run holds it now.
    async fn inbox(&self, owner: &Owner, request: InboxRequest) -> Result<InboxPage, StoreError>;

    /// [`RunLists::inbox`] as clients see each entry (its JSON); a store
    /// that keeps pages answers one without reading and encoding it.
    async fn inbox_views(&self, owner: &Owner, request: InboxRequest) -> Result<InboxViewPage, StoreError> {
        inbox_views_of(self.inbox(owner, request).await?)
    }
}

/// The events of runs, as their writes committed them.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// The run's events with a `seq` above `after`, oldest first, at most
    /// `limit`, following on from `after` without a gap (strongly
    /// consistent: what was committed before the call). Whose run it is,
    /// the caller checks.
    async fn events(&self, run_id: RunId, after: u64, limit: u32) -> Result<EventPage, StoreError>;

    /// The run's event `seq`, if it exists (strongly consistent).
    async fn event(&self, run_id: RunId, seq: u64) -> Result<Option<StoredEvent>, StoreError>;

    /// Where the store can tell, a signal that changes after every commit
    /// of new events of the run: take it before reading, then wait on it.
    /// `None`: the store cannot tell, and a reader polls.
    fn event_signal(&self, run_id: RunId) -> Option<tokio::sync::watch::Receiver<u64>>;
}

/// What the sweeper reads and repairs.
#[async_trait]
pub trait Upkeep: Send + Sync + 'static {
    /// Non-terminal runs whose `due_at` is at or before `until`, in due order,
    /// after `after` (exclusive) when paging. An index entry that cannot be
    /// read is logged and left out, never a reason to fail the page.
    async fn due(&self, until: Timestamp, after: Option<&DueRun>, limit: u32) -> Result<Vec<DueRun>, StoreError>;

    /// Where the count of active runs is written apart from the runs
    /// (DynamoDB): gives back the places on it that no run holds any more,
    /// those of runs that ended and of creates that died before writing
    /// their run, which a crash between the two writes leaves taken. Stores
    /// that write the count with the run have nothing to settle.
    async fn settle_counts(&self, now: Timestamp, deadline: Option<std::time::Instant>) -> Result<Settled, StoreError>;
}

/// Every port of runs, as one database implements them.
pub trait Store: RunStore + RunLists + EventLog + Upkeep {}

impl<T: RunStore + RunLists + EventLog + Upkeep> Store for T {}

/// A list page as clients see it, from the runs of a [`RunLists::list`].
pub fn views_of(page: ListPage, shown: ExtraFields) -> Result<ViewPage, StoreError> {
    let views = page.runs.iter().map(|run| run_view_json(run, shown)).collect::<Result<_, _>>()?;
    let last = page.resume_after.or_else(|| page.runs.last().map(|run| run.id));
    Ok(ViewPage { views, last, has_more: page.has_more })
}

/// An inbox page as clients see it, from a [`RunLists::inbox`].
pub fn inbox_views_of(page: InboxPage) -> Result<InboxViewPage, StoreError> {
    let views = page
        .entries
        .iter()
        .map(|entry| {
            serde_json::to_string(&crate::views::InboxEntryView::from(entry))
                .map(std::sync::Arc::from)
                .map_err(|error| StoreError::Defect(format!("cannot encode an inbox entry: {error}")))
        })
        .collect::<Result<_, _>>()?;
    let last = page.resume_after.or_else(|| page.entries.last().map(InboxEntry::position));
    Ok(InboxViewPage { views, last, has_more: page.has_more })
}

/// An API key as stored: never the key itself, only its SHA-256 hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKey {
    pub id: KeyId,
    pub owner: Owner,
    pub name: Option<String>,
    pub hash: [u8; 32],
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
    /// What the key may do; every scope for keys from before scopes.
    pub scopes: Scopes,
}

/// The most keys [`KeyStore::owner_keys`] answers.
pub const MAX_OWNER_KEYS: usize = 1_000;

#[async_trait]
pub trait KeyStore: Send + Sync + 'static {
    async fn put_key(&self, key: &StoredKey) -> Result<(), StoreError>;
    async fn find_key(&self, hash: &[u8; 32]) -> Result<Option<StoredKey>, StoreError>;
    /// Every key, of every owner: for the operator's CLI.
    async fn list_keys(&self) -> Result<Vec<StoredKey>, StoreError>;
    /// The owner's keys, revoked ones included, oldest first: the first
    /// [`MAX_OWNER_KEYS`].
    async fn owner_keys(&self, owner: &Owner) -> Result<Vec<StoredKey>, StoreError>;
    /// Marks the key revoked; `Ok(false)` when no such key exists.
    async fn revoke_key(&self, id: KeyId, at: Timestamp) -> Result<bool, StoreError>;
}

/// Operator-defined agents, by name.
#[async_trait]
pub trait AgentStore: Send + Sync + 'static {
    /// Creates or replaces the definition of that name.
    async fn put_agent(&self, agent: &AgentDefinition, at: Timestamp) -> Result<(), StoreError>;
    async fn get_agent(&self, name: &str) -> Result<Option<AgentDefinition>, StoreError>;
    /// Every definition, by name.
    async fn list_agents(&self) -> Result<Vec<AgentDefinition>, StoreError>;
    /// `Ok(false)` when no such agent exists.
    async fn delete_agent(&self, name: &str) -> Result<bool, StoreError>;
}

/// Each owner's approval policy, and the decisions people made that a
/// policy is tried on.
#[async_trait]
pub trait PolicyStore: Send + Sync + 'static {
    /// The owner's document (version 0 and no rules when none was put),
    /// unless it is still version `known` (`None`): a reader that keeps
    /// the document it read last decodes (and compiles) it only when it
    /// changed. Without `known`, always the document.
    async fn read_policy(&self, owner: &Owner, known: Option<u64>) -> Result<Option<Policy>, StoreError>;
    /// The owner's document: version 0 and no rules when none was put.
    async fn policy(&self, owner: &Owner) -> Result<Policy, StoreError> {
        Ok(self.read_policy(owner, None).await?.unwrap_or_default())
    }
    /// The owner's document unless it is still version `known` (`None`).
    async fn policy_unless(&self, owner: &Owner, known: u64) -> Result<Option<Policy>, StoreError> {
        self.read_policy(owner, Some(known)).await
    }
    /// Replaces the owner's document with `rules`, put `at` by `by`, one
    /// version on: the new document. With `expected`, only if its version
    /// is still that (`None` when another put came first); without, over
    /// whatever is there. All or nothing: a reader sees the old document
    /// or the new one.
    async fn put_policy(
        &self,
        owner: &Owner,
        expected: Option<u64>,
        rules: &[Rule],
        at: Timestamp,
        by: KeyId,
    ) -> Result<Option<Policy>, StoreError>;
    /// The owner's `limit` tool calls most recently decided by a person
    /// (approved, edited or rejected), newest first.
    async fn decided_calls(&self, owner: &Owner, limit: usize) -> Result<Vec<DecidedCall>, StoreError>;
}

/// A run's JSON as clients see it, for a list page.
pub fn run_view_json(run: &Run, shown: ExtraFields) -> Result<std::sync::Arc<str>, StoreError> {
    crate::views::run_json(run, shown).map_err(|error| StoreError::Defect(format!("cannot encode a run: {error}")))
}

/// A replaced webhook secret as both stores keep it.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct StoredSecret {
    secret: String,
    until: Timestamp,
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("StoredSecret").field("secret", &"<redacted>").field("until", &self.until).finish()
    }
}

pub fn encode_previous_secrets(previous: &[PreviousSecret]) -> Vec<StoredSecret> {
    previous.iter().map(|previous| StoredSecret { secret: previous.secret.expose(), until: previous.until }).collect()
}

pub fn decode_previous_secrets(stored: Vec<StoredSecret>) -> Result<Vec<PreviousSecret>, StoreError> {
    stored
        .into_iter()
        .map(|stored| {
            let secret = WebhookSecret::parse(&stored.secret)
                .ok_or_else(|| StoreError::Defect("malformed stored webhook secret".into()))?;
            Ok(PreviousSecret { secret, until: stored.until })
        })
        .collect()
}

/// One page of a list newest first, and whether more exist beyond it.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// Webhook endpoints and the record of their delivery attempts.
#[async_trait]
pub trait WebhookStore: Send + Sync + 'static {
    /// Adds the endpoint unless its owner already has `max_per_owner`:
    /// `Ok(false)`, nothing written.
    async fn create_webhook(&self, endpoint: &WebhookEndpoint, max_per_owner: usize) -> Result<bool, StoreError>;
    async fn get_webhook(&self, owner: &Owner, id: WebhookId) -> Result<Option<WebhookEndpoint>, StoreError>;
    /// The owner's endpoints, newest first, older than `before`.
    async fn list_webhooks(
        &self,
        owner: &Owner,
        before: Option<WebhookId>,
        limit: u32,
    ) -> Result<Page<WebhookEndpoint>, StoreError>;
    /// Removes the endpoint; its deliveries not yet made are dropped.
    /// `Ok(false)` when it does not exist.
    async fn delete_webhook(&self, owner: &Owner, id: WebhookId) -> Result<bool, StoreError>;
    /// Stores `endpoint`'s secrets if its stored secret is still `replaced`
    /// (a rotation); `Ok(false)` when it changed or the endpoint is gone.
    async fn rotate_webhook_secret(
        &self,
        endpoint: &WebhookEndpoint,
        replaced: &WebhookSecret,
    ) -> Result<bool, StoreError>;
    /// The endpoint's recent attempts, newest first, older than `before`.
    async fn deliveries(
        &self,
        owner: &Owner,
        id: WebhookId,
        before: Option<DeliveryId>,
        limit: u32,
    ) -> Result<Page<DeliveryAttempt>, StoreError>;
    /// Records an attempt and what it did to its endpoint.
    async fn record_attempt(
        &self,
        owner: &Owner,
        attempt: &DeliveryAttempt,
        health: EndpointHealth,
    ) -> Result<(), StoreError>;
}

/// A delivery whose time has come: the endpoint and the event as read,
/// and the delivery's place in the queue it waits in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<P> {
    pub place: P,
    /// The endpoint as the read found it (enabled).
    pub endpoint: WebhookEndpoint,
    pub run_id: RunId,
    pub event: StoredEvent,
    /// Attempts made so far.
    pub attempts: u32,
}

/// A delivery of the embedded server's outbox (written in the transaction
/// of its event), in its place there: the outbox row's id.
pub type PendingDelivery = Delivery<i64>;

/// Endpoints and owners whose deliveries a read of the outbox leaves out
/// (they have as many in flight as they may).
#[derive(Debug, Clone, Default)]
pub struct DueSkip {
    pub endpoints: Vec<WebhookId>,
    pub owners: Vec<Owner>,
}

/// The embedded server's outbox of deliveries.
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// Returns once a commit has queued deliveries since the last call
    /// (at once if one has).
    async fn deliveries_queued(&self);
    /// Deliveries due at `now`: for each endpoint with any, except those
    /// `skip` names, up to `per_endpoint` of them, the longest waiting
    /// first. Each endpoint's queue is read apart, so a long backlog of one
    /// never hides another's deliveries.
    async fn due_deliveries(
        &self,
        now: Timestamp,
        skip: &DueSkip,
        per_endpoint: u32,
    ) -> Result<Vec<PendingDelivery>, StoreError>;
    /// Puts the delivery back, not attempted, until `until` (unless it was
    /// removed or moved on meanwhile, or its run has its second event: a
    /// held `run.created` is then due).
    async fn hold_delivery(&self, delivery: &PendingDelivery, until: Timestamp) -> Result<(), StoreError>;
    /// Records the attempt and its effect on the endpoint, then schedules
    /// the delivery's next attempt at `retry_at`, or drops it when `None`
    /// (delivered, or given up), all in one transaction.
    async fn finish_delivery(
        &self,
        delivery: &PendingDelivery,
        attempt: &DeliveryAttempt,
        health: EndpointHealth,
        retry_at: Option<Timestamp>,
    ) -> Result<(), StoreError>;
}
