//! The one read-change-write loop: read the run, let a domain transition
//! decide, write it back on the condition that nothing else did meanwhile,
//! and start over from a fresh read when something did.

use std::time::Duration;

use rand::Rng;

use super::{RunStore, StoreError};
use agent_runs_domain::{Owner, Run, RunId};

/// How often a read-change-write starts over before it gives up.
pub const CHANGE_ATTEMPTS: u32 = 16;
/// The longest wait before starting over (a random part of it, growing).
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// What a transition made of the run.
#[derive(Debug)]
pub enum Transition<T> {
    /// It changed the run: write it.
    Write(T),
    /// It changed nothing: there is nothing to write.
    Keep(T),
}

impl<T> Transition<T> {
    pub fn write_if(changed: bool, value: T) -> Self {
        if changed { Transition::Write(value) } else { Transition::Keep(value) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChangeError<E> {
    #[error("the run does not exist")]
    Gone,
    /// The transition refused (the run's state does not allow it).
    #[error("the change was refused")]
    Refused(E),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The wait before starting over after the `attempt`-th conflict (from 0):
/// a random part of a ceiling that grows up to [`MAX_BACKOFF`].
pub async fn conflict_backoff(attempt: u32) {
    let cap = (100u64 << attempt.min(20)).min(MAX_BACKOFF.as_micros() as u64);
    let wait = Duration::from_micros(rand::rng().random_range(0..=cap));
    tokio::time::sleep(wait).await;
}

/// Applies `transition` to the run and writes the result, starting over
/// from a fresh read after a conflicting write, at most
/// [`CHANGE_ATTEMPTS`] times with a short random wait between. `known` is a
/// copy the caller already holds, tried first instead of a read. Returns
/// the run as stored afterwards and what the transition returned.
pub async fn change_run<T, E>(
    runs: &dyn RunStore,
    owner: &Owner,
    run_id: RunId,
    mut known: Option<Run>,
    mut transition: impl FnMut(&mut Run) -> Result<Transition<T>, E>,
) -> Result<(Run, T), ChangeError<E>> {
    for attempt in 0..CHANGE_ATTEMPTS {
        let mut run = match known.take() {
            Some(run) => run,
            None => runs.get(owner, run_id).await?.ok_or(ChangeError::Gone)?,
        };
        match transition(&mut run).map_err(ChangeError::Refused)? {
            Transition::Keep(value) => return Ok((run, value)),
            Transition::Write(value) => match runs.update(&mut run).await {
                Ok(()) => return Ok((run, value)),
                Err(StoreError::Conflict) if attempt + 1 < CHANGE_ATTEMPTS => conflict_backoff(attempt).await,
                Err(StoreError::Conflict) => {}
                Err(error) => return Err(error.into()),
            },
        }
    }
    Err(StoreError::Unavailable("the run kept changing under concurrent writes".into()).into())
}

/// [`change_run`] for a transition that only says whether it changed the
/// run: `Ok(true)` when it did and the change was written, `Ok(false)` when
/// it changed nothing or the run is gone.
pub async fn change_run_if(
    runs: &dyn RunStore,
    owner: &Owner,
    run_id: RunId,
    mut change: impl FnMut(&mut Run) -> bool,
) -> Result<bool, StoreError> {
    let changed = change_run(runs, owner, run_id, None, |run| {
        let changed = change(run);
        Ok::<_, std::convert::Infallible>(Transition::write_if(changed, changed))
    })
    .await;
    match changed {
        Ok((_, changed)) => Ok(changed),
        Err(ChangeError::Gone) => Ok(false),
        Err(ChangeError::Store(error)) => Err(error),
        Err(ChangeError::Refused(never)) => match never {},
    }
}
