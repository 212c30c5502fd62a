//! What the API asks of runs, apart from HTTP: start one (store it, queue
//! it, undo a create whose send failed, answer a repeated idempotency key),
//! cancel one, decide one of its approvals (and queue it again when the
//! last decision is in). `api/` parses requests into these calls and
//! formats what they return.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_runs_domain::{
    ApprovalId, ApprovalStatus, Budget, Changed, Clock, DecideOutcome, DecisionRequest, ExecutionPolicy, IdGenerator,
    KeyId, Owner, Resolver, Run, RunId, RunTrace, Timestamp, TransitionError, check_answer,
};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{QueueError, RunMessage, RunQueue};
use agent_runs_ports::store::{
    CHANGE_ATTEMPTS, ChangeError, IdempotencyClaim, InsertOutcome, RunStore, StoreError, Transition, change_run,
    conflict_backoff,
};

/// How long an idempotency key names the run it created.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// A replay can find its run undone a moment after it found the key
/// taken; the key is free again then, so the create starts over, this
/// many times at most.
const CREATE_ATTEMPTS: usize = 3;
/// How long a create whose write has an unknown outcome waits to send its
/// run before answering `503` (a Lambda's 10 s may be mostly spent).
const UNKNOWN_CREATE_SEND: Duration = Duration::from_secs(1);

pub struct Lifecycle {
    runs: Arc<dyn RunStore>,
    queue: Arc<dyn RunQueue>,
    clock: Arc<dyn Clock>,
    ids: IdGenerator,
    policy: ExecutionPolicy,
    max_active_runs: u32,
    /// Runs (at a version) sent for their decisions, and when (see
    /// [`Lifecycle::send_decided`]).
    recent_sends: Mutex<HashMap<(RunId, u64), Timestamp>>,
}

/// How long an answer may take to check against its question's schema (a
/// model may have written it). The check runs off the threads that answer
/// requests; past this nothing is recorded and the caller may try again
/// (`503`: a busy machine, not a wrong answer).
const ANSWER_CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// A run is sent again for a repeated decision at most this often by one
/// process: repeating a decision cannot flood the queue.
const RESEND_SPACING: Duration = Duration::from_secs(10);
/// Sends remembered; beyond it, those past their spacing are forgotten
/// (all of them if none is).
const RECENT_SENDS_CAPACITY: usize = 10_000;

/// A run to start, as a client asked for it.
pub struct NewRun {
    pub owner: Owner,
    /// The key that asked for it.
    pub created_by: KeyId,
    pub agent: String,
    pub input: String,
    pub metadata: BTreeMap<String, String>,
    /// What the client limits the run to spend.
    pub budget: Budget,
    /// The ended run it continues, with the state that run ended with.
    pub continues: Option<Run>,
    pub idempotency: Option<IdempotencyRequest>,
    /// The trace the run's spans belong to.
    pub trace: RunTrace,
}

/// The hashes of an `Idempotency-Key` and of the request that carried it.
pub struct IdempotencyRequest {
    pub key_hash: String,
    pub request_hash: String,
}

#[derive(Debug)]
pub enum Started {
    Created(Run),
    /// The run an earlier request with the same key created.
    Replayed(Run),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the idempotency key was used with a different request")]
    KeyReused,
    #[error("the owner has {max} active runs")]
    TooManyActiveRuns { max: u32 },
    #[error("the run could not be queued")]
    NotQueued(#[source] QueueError),
    #[error("an idempotency key kept being taken and released")]
    KeyChurn,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether a write of a read-change-write may have landed though the
/// caller did not see it succeed: it was tried, and the loop then started
/// over (after a conflict, which a write whose answer was lost also gives).
#[derive(Default)]
struct WritesSeen {
    tried: bool,
    may_have_landed: bool,
}

impl WritesSeen {
    /// At the start of each round of the loop.
    fn next_attempt(&mut self) {
        self.may_have_landed |= self.tried;
    }

    fn note<T>(&mut self, transition: Transition<T>) -> Transition<T> {
        self.tried |= matches!(transition, Transition::Write(_));
        transition
    }
}

/// One decision of a batch, with its place in the request.
#[derive(Debug, Clone)]
pub struct BatchDecision {
    pub index: usize,
    pub approval_id: ApprovalId,
    pub request: DecisionRequest,
}

/// What a batch has recorded so far.
#[derive(Default)]
struct BatchProgress {
    /// The runs as stored: written by the batch, or found decided already.
    recorded: Vec<Run>,
    /// Runs to send to the queue (their last pending approval was decided),
    /// each with whether its send is spaced (see [`Lifecycle::send_decided`]).
    to_send: Vec<(RunId, bool)>,
    /// Whether the batch wrote anything.
    wrote: bool,
}

/// Why a batch was not recorded, or not whole.
#[derive(Debug)]
pub struct BatchRefused {
    /// The decision that failed; `None` when the store did.
    pub index: Option<usize>,
    pub error: ChangeError<DecideRefused>,
    /// Whether the decisions of some runs were recorded all the same: only
    /// where a store cannot write the batch in one transaction, and a
    /// change of another writer came between two of them.
    pub partly_recorded: bool,
}

/// Why a decision was not recorded.
#[derive(Debug)]
pub enum DecideRefused {
    /// The approval had expired: it is now, and the run has failed.
    Expired,
    Transition(TransitionError),
}

/// An answer checked against its question's schema as the run `read`
/// has it, on a blocking thread and within [`ANSWER_CHECK_DEADLINE`],
/// before any write: the threads that answer requests never run a
/// model-written schema's check first (the decision's own check then finds
/// the schema compiled and the answer checked moments ago). An approval no
/// longer pending, or past its expiry, is left to the decision itself,
/// which refuses it for that. `index`: the decision's place in a batch.
async fn check_answer_aside(
    read: &Run,
    now: Timestamp,
    index: Option<usize>,
    approval_id: ApprovalId,
    request: &DecisionRequest,
) -> Result<(), (Option<usize>, ChangeError<DecideRefused>)> {
    let asked = read.approvals.iter().find(|approval| approval.id == approval_id);
    let pending = asked.is_some_and(|approval| approval.status == ApprovalStatus::Pending)
        && !read.approval_past_expiry(approval_id, now);
    let (Some(schema), Some(answer)) = (
        asked.and_then(|approval| approval.input_schema.clone()).filter(|_| pending),
        request.decision.answer().cloned(),
    ) else {
        return Ok(());
    };
    let refused = |problem: String| {
        (index, ChangeError::Refused(DecideRefused::Transition(TransitionError::AnswerRefused(problem))))
    };
    let checking = tokio::task::spawn_blocking(move || check_answer(&schema, &answer));
    match tokio::time::timeout(ANSWER_CHECK_DEADLINE, checking).await {
        Ok(Ok(checked)) => checked.map_err(refused),
        Ok(Err(failed)) => {
            Err((index, ChangeError::Store(StoreError::Defect(format!("the answer check failed: {failed}")))))
        }
        Err(_) => Err((
            index,
            ChangeError::Store(StoreError::Refused(
                format!("the answer was not checked within {} seconds", ANSWER_CHECK_DEADLINE.as_secs()).into(),
            )),
        )),
    }
}

impl Lifecycle {
    pub fn new(
        runs: Arc<dyn RunStore>,
        queue: Arc<dyn RunQueue>,
        clock: Arc<dyn Clock>,
        policy: ExecutionPolicy,
        max_active_runs: u32,
    ) -> Self {
        Lifecycle {
            runs,
            queue,
            clock,
            ids: IdGenerator::default(),
            policy,
            max_active_runs,
            recent_sends: Mutex::default(),
        }
    }

    pub async fn start(&self, new_run: NewRun) -> Result<Started, StartError> {
        let NewRun { owner, created_by, agent, input, metadata, budget, continues, idempotency, trace } = new_run;
        for _ in 0..CREATE_ATTEMPTS {
            let now = self.clock.now();
            let run_id = RunId::from_ulid(self.ids.ulid_at(now));
            let claim = idempotency.as_ref().map(|request| IdempotencyClaim {
                key_hash: request.key_hash.clone(),
                request_hash: request.request_hash.clone(),
                created_at: now,
                expires_at: now.plus(IDEMPOTENCY_WINDOW),
            });
            let mut run = Run::new(run_id, owner.clone(), agent.clone(), input.clone(), metadata.clone(), &self.policy)
                .created_by(created_by)
                .with_budget(budget)
                .with_trace(trace);
            if let Some(previous) = &continues {
                run = run.continuing(previous);
            }
            let inserted = match self.runs.insert(&mut run, claim.as_ref(), self.max_active_runs).await {
                Ok(inserted) => inserted,
                Err(error) => {
                    if matches!(error, StoreError::Unavailable(_)) {
                        // The run may be written all the same (a write that
                        // timed out can land): sent now, it starts at once,
                        // not at the sweeper's requeue. A worker drops a
                        // message for a run that does not exist. (A write
                        // the store refused wrote nothing: no message.) A
                        // short wait, so the 503 still goes out in time.
                        let message = RunMessage { run_id, owner: owner.clone() };
                        let sent = tokio::time::timeout(UNKNOWN_CREATE_SEND, self.queue.enqueue(&message)).await;
                        if !matches!(sent, Ok(Ok(()))) {
                            tracing::warn!(run_id = %run_id, "a create of unknown outcome could not send its run; the sweeper will, should it exist");
                        }
                    }
                    return Err(error.into());
                }
            };
            match inserted {
                InsertOutcome::Inserted => {
                    let key_hash = claim.as_ref().map(|claim| claim.key_hash.as_str());
                    return self.enqueue_created(run, key_hash).await.map(Started::Created);
                }
                InsertOutcome::IdempotencyKeyTaken(record) => {
                    if idempotency.as_ref().is_some_and(|request| request.request_hash != record.request_hash) {
                        return Err(StartError::KeyReused);
                    }
                    if let Some(run) = self.replay(&owner, record.run_id).await? {
                        return Ok(Started::Replayed(run));
                    }
                }
                InsertOutcome::TooManyActiveRuns => {
                    return Err(StartError::TooManyActiveRuns { max: self.max_active_runs });
                }
            }
        }
        Err(StartError::KeyChurn)
    }

    /// A created run is sent to the queue; when the send fails the create
    /// is undone, unless the run has moved on meanwhile (a worker claimed
    /// it, so the send was delivered after all, or a replay answered with
    /// it): then it stays, and is answered as created too.
    async fn enqueue_created(&self, run: Run, key_hash: Option<&str>) -> Result<Run, StartError> {
        let message = RunMessage { run_id: run.id, owner: run.owner.clone() };
        let Err(queue_error) = self.queue.enqueue(&message).await else {
            return Ok(run);
        };
        match self.runs.undo_create(&run, key_hash).await {
            Ok(true) => Err(StartError::NotQueued(queue_error)),
            Ok(false) => {
                tracing::info!(run_id = %run.id, "enqueue failed but the run had moved on; it is kept");
                Ok(run)
            }
            Err(store_error) => {
                // The undo may or may not happen yet (a write that timed out
                // can still land). Only a conditional write settles it: a
                // pin the undo's condition refuses keeps the run, and it is
                // answered; a run gone, or a pin that fails, is a 503.
                tracing::error!(run_id = %run.id, error = %error_chain(&store_error), "could not undo a create whose enqueue failed");
                match self.pin(&run.owner, run.id).await {
                    Ok(Some((kept, _))) => {
                        // The sweeper sends it if this send fails too.
                        let _ = self.queue.enqueue(&message).await;
                        Ok(kept)
                    }
                    Ok(None) | Err(_) => Err(StartError::NotQueued(queue_error)),
                }
            }
        }
    }

    /// The run a repeated idempotency key created, or `None` when that
    /// create was undone meanwhile (the key is free again).
    async fn replay(&self, owner: &Owner, run_id: RunId) -> Result<Option<Run>, StartError> {
        // The first request may still be waiting on its send, and would
        // undo the create should the send fail. Pin the run before
        // answering with it, and send it ourselves: a duplicate message is
        // harmless, a missing one is not.
        let Some((run, pinned)) = self.pin(owner, run_id).await? else {
            return Ok(None);
        };
        if pinned {
            let message = RunMessage { run_id, owner: owner.clone() };
            self.queue.enqueue(&message).await.map_err(StartError::NotQueued)?;
        }
        Ok(Some(run))
    }

    /// Makes a run no worker has touched yet safe from an undo of its
    /// create: a write (a version bump) that the undo's condition refuses.
    /// The run and whether this call pinned it (or may have: a pin whose
    /// answer was lost reads back as already pinned); `None` when gone.
    async fn pin(&self, owner: &Owner, run_id: RunId) -> Result<Option<(Run, bool)>, StoreError> {
        let mut writes = WritesSeen::default();
        let pinned = change_run(self.runs.as_ref(), owner, run_id, None, |run| {
            writes.next_attempt();
            let pin = run.is_as_created();
            Ok::<_, std::convert::Infallible>(writes.note(Transition::write_if(pin, pin)))
        })
        .await;
        match pinned {
            Ok((run, pinned)) => Ok(Some((run, pinned || writes.may_have_landed))),
            Err(ChangeError::Gone) => Ok(None),
            Err(ChangeError::Store(error)) => Err(error),
            Err(ChangeError::Refused(never)) => match never {},
        }
    }

    pub async fn cancel(&self, owner: &Owner, run_id: RunId) -> Result<Run, ChangeError<TransitionError>> {
        let (run, ()) = change_run(self.runs.as_ref(), owner, run_id, None, |run| {
            run.cancel(self.clock.now()).map(|changed| Transition::write_if(changed == Changed::Yes, ()))
        })
        .await?;
        Ok(run)
    }

    /// Records a decision on `read`, the run as the caller read it (tried
    /// first; a fresh read when it changed meanwhile). When it was the last
    /// one the run waited for, the run is queued again (should that send
    /// fail, the sweeper sends it).
    pub async fn decide(
        &self,
        read: Run,
        approval_id: ApprovalId,
        request: DecisionRequest,
    ) -> Result<Run, ChangeError<DecideRefused>> {
        let (owner, run_id) = (read.owner.clone(), read.id);
        // A decision is judged at the time it arrived: its answer's check
        // does not count against the approval's expiry or window.
        let arrived = self.clock.now();
        check_answer_aside(&read, arrived, None, approval_id, &request).await.map_err(|(_, refused)| refused)?;
        let mut writes = WritesSeen::default();
        let (run, outcome) = change_run(self.runs.as_ref(), &owner, run_id, Some(read), |run| {
            writes.next_attempt();
            let now = arrived;
            if run.expire_if_due(approval_id, now, &self.policy) {
                return Ok(writes.note(Transition::Write(None)));
            }
            // Past its veto window, the approval is approved first: an
            // approve then repeats it, anything else is refused.
            let auto = run.auto_approve_if_due(approval_id, now, &self.policy);
            let decided =
                run.decide(approval_id, request.clone(), now, &self.policy).map_err(DecideRefused::Transition)?;
            let outcome = auto.map_or(decided, |auto| auto.max(decided));
            Ok(writes.note(Transition::write_if(outcome != DecideOutcome::Unchanged, Some(outcome))))
        })
        .await?;
        // A decision already made (this call's, whose answer was lost, or an
        // earlier request's answered 503 after it landed) reads back as
        // unchanged: a run still queued with nothing pending is sent all the
        // same, as a create's replay is. A duplicate message is dropped by
        // the worker's claim; a missing one would leave the run to the
        // sweeper's requeue a minute later.
        let requeued_unseen = outcome == Some(DecideOutcome::Unchanged) && run.is_requeued_after_decisions();
        if outcome.is_none() {
            return Err(ChangeError::Refused(DecideRefused::Expired));
        }
        if outcome == Some(DecideOutcome::Requeued) || requeued_unseen {
            // This call's own write (that may have landed) owes its send;
            // only a repeat of another request's decision is spaced.
            self.send_decided(&run, requeued_unseen && !writes.may_have_landed).await;
        }
        Ok(run)
    }

    /// Sends a run its decisions resumed. `spaced`: the decisions were made
    /// by another request (whose answer may have been lost), and the run is
    /// not sent when this process sent it moments ago at this version (a new
    /// park is a new version): repeating a decision cannot flood the queue.
    async fn send_decided(&self, run: &Run, spaced: bool) {
        let now = self.clock.now();
        let key = (run.id, run.version);
        let sent_lately =
            || agent_runs_ports::lock(&self.recent_sends).get(&key).is_some_and(|at| now.since(*at) < RESEND_SPACING);
        if (spaced && sent_lately()) || !self.send_resumed(run).await {
            return;
        }
        let mut sent = agent_runs_ports::lock(&self.recent_sends);
        if sent.len() >= RECENT_SENDS_CAPACITY {
            sent.retain(|_, at| now.since(*at) < RESEND_SPACING);
            if sent.len() >= RECENT_SENDS_CAPACITY {
                sent.clear();
            }
        }
        sent.insert(key, now);
    }

    /// Queues a run its last decision resumed; should the send fail, the
    /// sweeper sends it. Whether it was sent.
    async fn send_resumed(&self, run: &Run) -> bool {
        let message = RunMessage { run_id: run.id, owner: run.owner.clone() };
        match self.queue.enqueue(&message).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(run_id = %run.id, error = %error_chain(&error), "enqueue after the last decision failed; the sweeper will retry");
                false
            }
        }
    }

    /// Records the decisions on `runs` (as the caller read them, each with
    /// its decisions in request order), all of them or none: every decision
    /// is checked before anything is written, and the runs are written
    /// together (see [`RunStore::update_batch`]). A run whose last pending
    /// approval was decided is queued again. Returns the runs as stored.
    pub async fn decide_batch(&self, runs: Vec<(Run, Vec<BatchDecision>)>) -> Result<Vec<Run>, BatchRefused> {
        let mut progress = BatchProgress::default();
        let result = self.record_batch(runs, &mut progress).await;
        // Whatever was written is sent, however the batch ended; runs
        // decided before, as a repeated single decision sends them.
        for (run_id, spaced) in &progress.to_send {
            if let Some(run) = progress.recorded.iter().find(|run| run.id == *run_id) {
                self.send_decided(run, *spaced).await;
            }
        }
        match result {
            Ok(()) => Ok(progress.recorded),
            Err((index, error)) => Err(BatchRefused { index, error, partly_recorded: progress.wrote }),
        }
    }

    async fn record_batch(
        &self,
        runs: Vec<(Run, Vec<BatchDecision>)>,
        progress: &mut BatchProgress,
    ) -> Result<(), (Option<usize>, ChangeError<DecideRefused>)> {
        let first_versions: Vec<(RunId, u64)> = runs.iter().map(|(run, _)| (run.id, run.version)).collect();
        let mut pending = runs;
        let mut may_have_landed = false;
        for attempt in 0..CHANGE_ATTEMPTS {
            if attempt > 0 {
                for (run, decisions) in &mut pending {
                    let first = decisions.first().map(|decision| decision.index);
                    let fresh = self.runs.get(&run.owner, run.id).await.map_err(|error| (first, error.into()))?;
                    *run = fresh.ok_or((first, ChangeError::Gone))?;
                }
            }
            let now = self.clock.now();
            let mut changed = Vec::new();
            let mut done = Vec::new();
            for (position, (run, decisions)) in pending.iter().enumerate() {
                let mut next = run.clone();
                let mut outcome = DecideOutcome::Unchanged;
                for decision in decisions {
                    let refused = |why| (Some(decision.index), ChangeError::Refused(why));
                    if next.approval_past_expiry(decision.approval_id, now) {
                        return Err(refused(DecideRefused::Expired));
                    }
                    if let Some(auto) = next.auto_approve_if_due(decision.approval_id, now, &self.policy) {
                        outcome = outcome.max(auto);
                    }
                    // In the batch's order: the first decision that fails is the answer.
                    check_answer_aside(&next, now, Some(decision.index), decision.approval_id, &decision.request)
                        .await?;
                    let decided = next
                        .decide(decision.approval_id, decision.request.clone(), now, &self.policy)
                        .map_err(|error| refused(DecideRefused::Transition(error)))?;
                    outcome = outcome.max(decided);
                }
                if outcome == DecideOutcome::Unchanged {
                    // A write whose answer was lost reads back as a repeat:
                    // the run moved on since the first read and every
                    // decision stands as this batch's key made it. Its send
                    // is owed; a run decided by an earlier request is sent
                    // again, spaced, as a single decision is.
                    let mut own_write = false;
                    if may_have_landed {
                        let read_first = first_versions.iter().find(|(id, _)| *id == next.id).map(|(_, v)| *v);
                        let ours = decisions.iter().all(|decision| {
                            next.approvals.iter().any(|approval| {
                                approval.id == decision.approval_id
                                    && approval.resolved_by.as_ref().and_then(Resolver::key)
                                        == decision.request.decided_by
                            })
                        });
                        progress.wrote |= ours && read_first.is_some_and(|version| next.version > version);
                        own_write = ours;
                    }
                    if next.is_requeued_after_decisions() {
                        progress.to_send.push((next.id, !own_write));
                    }
                    done.push(position);
                    progress.recorded.push(next);
                } else {
                    changed.push((position, next, outcome));
                }
            }
            let mut writes: Vec<Run> = changed.iter().map(|(_, run, _)| run.clone()).collect();
            let result = self.runs.update_batch(&mut writes).await;
            let written = result.as_ref().map_or_else(|failed| failed.written, |()| writes.len());
            for ((position, _, outcome), run) in changed.iter().zip(writes).take(written) {
                if *outcome == DecideOutcome::Requeued {
                    progress.to_send.push((run.id, false));
                }
                progress.wrote = true;
                done.push(*position);
                progress.recorded.push(run);
            }
            pending =
                pending.into_iter().enumerate().filter(|(at, _)| !done.contains(at)).map(|(_, left)| left).collect();
            match result {
                Ok(()) => return Ok(()),
                Err(failed) if matches!(failed.error, StoreError::Conflict) => {
                    may_have_landed = true;
                    conflict_backoff(attempt).await;
                }
                Err(failed) => return Err((None, failed.error.into())),
            }
        }
        let error = StoreError::Unavailable("the runs kept changing under concurrent writes".into());
        Err((None, error.into()))
    }

    /// Moves a pending approval's expiry to `by` from now. An approval
    /// found past its time expires instead (and the run fails): extending
    /// never revives one.
    pub async fn extend(
        &self,
        read: Run,
        approval_id: ApprovalId,
        by: Duration,
    ) -> Result<Run, ChangeError<DecideRefused>> {
        let (owner, run_id) = (read.owner.clone(), read.id);
        let (run, extended) = change_run(self.runs.as_ref(), &owner, run_id, Some(read), |run| {
            let now = self.clock.now();
            if run.expire_if_due(approval_id, now, &self.policy) {
                return Ok(Transition::Write(false));
            }
            // Its veto window is over: the sweeper approves it.
            if run.clone().auto_approve_if_due(approval_id, now, &self.policy).is_some() {
                return Err(DecideRefused::Transition(TransitionError::ApprovalAlreadyResolved(
                    ApprovalStatus::Approved,
                )));
            }
            let changed = run.extend_approval(approval_id, by, now, &self.policy).map_err(DecideRefused::Transition)?;
            Ok(Transition::write_if(changed == Changed::Yes, true))
        })
        .await?;
        if extended { Ok(run) } else { Err(ChangeError::Refused(DecideRefused::Expired)) }
    }
}
