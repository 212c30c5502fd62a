//! Create: a run of an agent that accepts the input, within the agent's
//! own budget, optionally continuing an ended run; stored, then queued
//! (a create whose send failed is undone), at most once per
//! `Idempotency-Key` (a repeat answers with the run the first created).

use std::collections::BTreeMap;
use std::time::Duration;

use agent_runs_domain::{Budget, IdempotencyKey, KeyId, Metadata, Owner, Run, RunId, RunInput, RunTrace, sha256_hex};
use agent_runs_ports::error_chain;
use agent_runs_ports::queue::{QueueError, RunMessage};
use agent_runs_ports::store::{ChangeError, IdempotencyClaim, InsertOutcome, StoreError, Transition, change_run};

use super::continuation::ContinueRefused;
use super::{RunCommands, WritesSeen};
use crate::auth::Principal;

/// How long an idempotency key names the run it created.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// A replay can find its run undone a moment after it found the key
/// taken; the key is free again then, so the create starts over, this
/// many times at most.
const CREATE_ATTEMPTS: usize = 3;
/// How long a create whose write has an unknown outcome waits to send its
/// run before answering `503` (a Lambda's 10 s may be mostly spent).
const UNKNOWN_CREATE_SEND: Duration = Duration::from_secs(1);

/// A run to create, as a client asked for it.
pub struct NewRun {
    pub input: RunInput,
    /// The agent to run; without one, the continued run's, else the default.
    pub agent: Option<String>,
    pub metadata: Metadata,
    /// What the client limits the run to spend.
    pub budget: Budget,
    /// The ended run this one continues.
    pub previous_run_id: Option<RunId>,
    /// The trace the run's spans belong to.
    pub trace: RunTrace,
}

#[derive(Debug)]
pub enum Started {
    Created(Run),
    /// The run an earlier request with the same key created.
    Replayed(Run),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the run to continue cannot be continued")]
    Previous { run_id: RunId, why: ContinueRefused },
    #[error("no agent has that name")]
    UnknownAgent { agent: String, available: String },
    #[error("the agent refused the input")]
    InputRejected { agent: String, reason: String },
    #[error("the budget asks for more than the agent allows")]
    OverAgentBudget { field: &'static str, most: u64, agent: String },
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

/// A run the rules accept, ready to start.
pub struct Accepted {
    owner: Owner,
    created_by: KeyId,
    agent: String,
    input: String,
    metadata: BTreeMap<String, String>,
    budget: Budget,
    continues: Option<Run>,
    trace: RunTrace,
}

/// The hashes of an `Idempotency-Key` and of the request that carried it.
struct IdempotencyClaimed {
    key_hash: String,
    request_hash: String,
}

impl RunCommands {
    /// What `by` asks for, judged by the rules (the run continued, the
    /// agent and its view of the input, its budget); nothing is written.
    pub async fn accept(&self, by: &Principal, new_run: NewRun) -> Result<Accepted, StartError> {
        let NewRun { input, agent, metadata, budget, previous_run_id, trace } = new_run;
        let continues = match previous_run_id {
            Some(run_id) => match self.run_to_continue(&by.owner, run_id, agent.as_deref()).await? {
                Ok(previous) => Some(previous),
                Err(why) => return Err(StartError::Previous { run_id, why }),
            },
            None => None,
        };
        let agent = match (agent, &continues) {
            (Some(agent), _) => agent,
            (None, Some(previous)) => previous.agent.clone(),
            (None, None) => self.agents.default_name().to_owned(),
        };
        // Last, as it may read the store: the agent and what it thinks of the input.
        match self.agents.check(&agent, input.as_str()).await? {
            None => return Err(StartError::UnknownAgent { agent, available: self.agents.names() }),
            Some(Err(reason)) => return Err(StartError::InputRejected { agent, reason }),
            Some(Ok(())) => {}
        }
        // Read only when asked: the agent's own limits apply at execution anyway.
        let allowed = if budget == Budget::default() { Budget::default() } else { self.agents.budget(&agent).await? };
        for (field, asked, most) in [
            ("max_total_tokens", budget.max_total_tokens, allowed.max_total_tokens),
            ("max_tool_calls", budget.max_tool_calls, allowed.max_tool_calls),
        ] {
            if let (Some(asked), Some(most)) = (asked, most)
                && asked > most
            {
                return Err(StartError::OverAgentBudget { field, most, agent });
            }
        }
        Ok(Accepted {
            owner: by.owner.clone(),
            created_by: by.key_id,
            agent,
            input: input.into_string(),
            metadata: metadata.into_map(),
            budget,
            continues,
            trace,
        })
    }

    /// Stores and queues an accepted run, once per `Idempotency-Key`.
    pub async fn start(
        &self,
        accepted: Accepted,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Started, StartError> {
        let idempotency = idempotency_key.map(|key| IdempotencyClaimed {
            key_hash: sha256_hex(key.as_str().as_bytes()),
            request_hash: request_hash(&accepted),
        });
        let Accepted { owner, created_by, agent, input, metadata, budget, continues, trace } = accepted;
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
}

/// A fingerprint of what the request asks for, insensitive to formatting.
fn request_hash(accepted: &Accepted) -> String {
    let Accepted { agent, input, metadata, budget, continues, .. } = accepted;
    let mut canonical = serde_json::json!({
        "agent": agent,
        "input": input,
        "metadata": metadata,
    });
    // Only when set, so requests without one keep the fingerprints they had.
    if *budget != Budget::default() {
        canonical["budget"] = serde_json::json!([budget.max_total_tokens, budget.max_tool_calls]);
    }
    if let Some(previous) = continues {
        canonical["previous_run_id"] = previous.id.to_string().into();
    }
    sha256_hex(canonical.to_string().as_bytes())
}
