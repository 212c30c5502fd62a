//! A store with hooks around its calls: the one decorator of the store
//! ports. Metrics, fault injection and test observers are each a [`Hooks`]
//! implementation, so a port's new method is forwarded here once for all.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::{
    BatchWriteError, DueRun, EventLog, EventPage, IdempotencyClaim, InboxPage, InboxRequest, InboxViewPage,
    InsertOutcome, ListPage, ListRequest, RunLists, RunStore, Settled, StoreError, StoredEvent, Upkeep, ViewPage,
};
use agent_runs_domain::{Owner, Run, RunId, Timestamp};

/// A call of a store port, as hooks see it.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    Insert(&'a Run),
    UndoCreate(&'a Run),
    Get(RunId),
    GetToContinue(RunId),
    Update(&'a Run),
    UpdateBatch(&'a [Run]),
    List,
    ListViews,
    Inbox,
    Events(RunId),
    Event(RunId),
    Due,
    SettleCounts { deadline: Option<std::time::Instant> },
}

impl Call<'_> {
    /// The port method's name.
    pub fn name(&self) -> &'static str {
        match self {
            Call::Insert(_) => "insert",
            Call::UndoCreate(_) => "undo_create",
            Call::Get(_) => "get",
            Call::GetToContinue(_) => "get_to_continue",
            Call::Update(_) => "update",
            Call::UpdateBatch(_) => "update_batch",
            Call::List => "list",
            Call::ListViews => "list_views",
            Call::Inbox => "inbox",
            Call::Events(_) => "events",
            Call::Event(_) => "event",
            Call::Due => "due",
            Call::SettleCounts { .. } => "settle_counts",
        }
    }
}

/// How the store answered a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub ok: bool,
    /// The runs written: the first `written` of the call's (as written:
    /// versions counted, events cleared). Zero for a read.
    pub written: usize,
}

/// What a [`Layered`] store does around each call of the store it wraps.
#[async_trait]
pub trait Hooks: Send + Sync + 'static {
    /// What `before` learns that `after` needs.
    type Seen: Send;

    /// Whether `after` may put an error in place of an answer. The layer
    /// then keeps a copy of each run a write is given, so the caller's run
    /// is left as it was, as after a write that failed.
    const MAY_FAIL_AFTER: bool = false;

    /// Before the call reaches the store. An error is answered in its
    /// place, and the store is not called.
    async fn before(&self, call: Call<'_>) -> Result<Self::Seen, StoreError>;

    /// After the store answered; `call` shows the runs as written. An error
    /// is answered in place of the store's answer.
    async fn after(&self, call: Call<'_>, seen: Self::Seen, answer: Answer) -> Option<StoreError>;
}

/// `inner`, with `hooks` around each call.
pub struct Layered<S: ?Sized, H> {
    inner: Arc<S>,
    hooks: H,
}

impl<S: ?Sized, H: Hooks> Layered<S, H> {
    pub fn new(inner: Arc<S>, hooks: H) -> Self {
        Layered { inner, hooks }
    }

    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    async fn read<T>(
        &self,
        call: Call<'_>,
        read: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let seen = self.hooks.before(call).await?;
        let result = read.await;
        match self.hooks.after(call, seen, Answer { ok: result.is_ok(), written: 0 }).await {
            Some(error) => Err(error),
            None => result,
        }
    }

    fn keep(runs: &[Run]) -> Option<Vec<Run>> {
        H::MAY_FAIL_AFTER.then(|| runs.to_vec())
    }
}

#[async_trait]
impl<S: RunStore + ?Sized, H: Hooks> RunStore for Layered<S, H> {
    async fn insert(
        &self,
        run: &mut Run,
        idempotency: Option<&IdempotencyClaim>,
        max_active: u32,
    ) -> Result<InsertOutcome, StoreError> {
        let seen = self.hooks.before(Call::Insert(run)).await?;
        let kept = Self::keep(std::slice::from_ref(run));
        let result = self.inner.insert(run, idempotency, max_active).await;
        let written = usize::from(matches!(result, Ok(InsertOutcome::Inserted)));
        match self.hooks.after(Call::Insert(run), seen, Answer { ok: result.is_ok(), written }).await {
            None => result,
            Some(error) => {
                restore(std::slice::from_mut(run), kept);
                Err(error)
            }
        }
    }

    async fn undo_create(&self, run: &Run, idempotency_key_hash: Option<&str>) -> Result<bool, StoreError> {
        self.read(Call::UndoCreate(run), self.inner.undo_create(run, idempotency_key_hash)).await
    }

    async fn get(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.read(Call::Get(run_id), self.inner.get(owner, run_id)).await
    }

    async fn get_to_continue(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StoreError> {
        self.read(Call::GetToContinue(run_id), self.inner.get_to_continue(owner, run_id)).await
    }

    async fn update(&self, run: &mut Run) -> Result<(), StoreError> {
        let seen = self.hooks.before(Call::Update(run)).await?;
        let kept = Self::keep(std::slice::from_ref(run));
        let result = self.inner.update(run).await;
        let answer = Answer { ok: result.is_ok(), written: usize::from(result.is_ok()) };
        match self.hooks.after(Call::Update(run), seen, answer).await {
            None => result,
            Some(error) => {
                restore(std::slice::from_mut(run), kept);
                Err(error)
            }
        }
    }

    async fn update_batch(&self, runs: &mut [Run]) -> Result<(), BatchWriteError> {
        let unwritten = |error| BatchWriteError { written: 0, error };
        let seen = self.hooks.before(Call::UpdateBatch(runs)).await.map_err(unwritten)?;
        let kept = Self::keep(runs);
        let result = self.inner.update_batch(runs).await;
        let written = result.as_ref().map_or_else(|failed| failed.written, |()| runs.len());
        match self.hooks.after(Call::UpdateBatch(runs), seen, Answer { ok: result.is_ok(), written }).await {
            None => result,
            Some(error) => {
                restore(runs, kept);
                Err(unwritten(error))
            }
        }
    }
}

/// Puts back the runs a write was given, where they were kept.
fn restore(runs: &mut [Run], kept: Option<Vec<Run>>) {
    debug_assert!(kept.is_some() || runs.is_empty(), "a hook put an error in place of a write without MAY_FAIL_AFTER");
    if let Some(kept) = kept {
        runs.clone_from_slice(&kept);
    }
}

#[async_trait]
impl<S: RunLists + ?Sized, H: Hooks> RunLists for Layered<S, H> {
    async fn list(&self, owner: &Owner, request: ListRequest) -> Result<ListPage, StoreError> {
        self.read(Call::List, self.inner.list(owner, request)).await
    }

    async fn list_views(&self, owner: &Owner, request: ListRequest) -> Result<ViewPage, StoreError> {
        self.read(Call::ListViews, self.inner.list_views(owner, request)).await
    }

    async fn run_json(&self, owner: &Owner, run_id: RunId) -> Result<Option<std::sync::Arc<str>>, StoreError> {
        self.read(Call::Get(run_id), self.inner.run_json(owner, run_id)).await
    }

    async fn inbox(&self, owner: &Owner, request: InboxRequest) -> Result<InboxPage, StoreError> {
        self.read(Call::Inbox, self.inner.inbox(owner, request)).await
    }

    async fn inbox_views(&self, owner: &Owner, request: InboxRequest) -> Result<InboxViewPage, StoreError> {
        self.read(Call::Inbox, self.inner.inbox_views(owner, request)).await
    }
}

#[async_trait]
impl<S: EventLog + ?Sized, H: Hooks> EventLog for Layered<S, H> {
    async fn events(&self, run_id: RunId, after: u64, limit: u32) -> Result<EventPage, StoreError> {
        self.read(Call::Events(run_id), self.inner.events(run_id, after, limit)).await
    }

    async fn event(&self, run_id: RunId, seq: u64) -> Result<Option<StoredEvent>, StoreError> {
        self.read(Call::Event(run_id), self.inner.event(run_id, seq)).await
    }

    fn event_signal(&self, run_id: RunId) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.event_signal(run_id)
    }
}

#[async_trait]
impl<S: Upkeep + ?Sized, H: Hooks> Upkeep for Layered<S, H> {
    async fn due(&self, until: Timestamp, after: Option<&DueRun>, limit: u32) -> Result<Vec<DueRun>, StoreError> {
        self.read(Call::Due, self.inner.due(until, after, limit)).await
    }

    async fn settle_counts(&self, now: Timestamp, deadline: Option<std::time::Instant>) -> Result<Settled, StoreError> {
        self.read(Call::SettleCounts { deadline }, self.inner.settle_counts(now, deadline)).await
    }
}
