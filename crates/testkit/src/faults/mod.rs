//! Fault injection at the ports, for tests of what failures do: wrappers
//! around a store and a queue that fail chosen calls, before or after the
//! call reaches the real adapter, as a crash, a timeout or an outage would.

mod aws;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use agent_runs_ports::queue::{QueueError, RunMessage, RunQueue};
use agent_runs_ports::store::{Answer, Call, Hooks, Layered, Store, StoreError};

pub use aws::{AwsError, AwsErrorInterceptor, CapacityCounts, CapacityLimits, CapacityModel};

/// What happens to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// The call fails without reaching the adapter.
    FailBefore,
    /// The call reaches the adapter and takes effect, but its caller sees a
    /// failure (a timeout, or a crash right after it).
    FailAfter,
    /// A store `update` lands, but its answer is lost and the retry finds
    /// its own condition gone: the caller sees `Conflict`. Other calls
    /// take it as [`Fault::FailAfter`].
    ConflictAfter,
}

/// Decides, call by call, which calls fail.
pub trait FaultPlan: Send + Sync + 'static {
    fn next(&self, operation: &'static str) -> Fault;
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault in {0}")]
pub struct InjectedFault(pub &'static str);

/// No faults.
pub struct Healthy;

impl FaultPlan for Healthy {
    fn next(&self, _operation: &'static str) -> Fault {
        Fault::None
    }
}

/// A process that stops dead at its `at`-th call (counting from 0), before
/// or after that call takes effect: every later call fails too.
pub struct CrashAt {
    at: usize,
    after: bool,
    calls: AtomicUsize,
    dead: AtomicBool,
}

impl CrashAt {
    pub fn new(at: usize, after: bool) -> Arc<Self> {
        Arc::new(CrashAt { at, after, calls: AtomicUsize::new(0), dead: AtomicBool::new(false) })
    }

    pub fn crashed(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

impl FaultPlan for CrashAt {
    fn next(&self, _operation: &'static str) -> Fault {
        if self.dead.load(Ordering::SeqCst) {
            return Fault::FailBefore;
        }
        if self.calls.fetch_add(1, Ordering::SeqCst) != self.at {
            return Fault::None;
        }
        self.dead.store(true, Ordering::SeqCst);
        if self.after { Fault::FailAfter } else { Fault::FailBefore }
    }
}

/// Gives `fault` to the calls of one operation whose number (from 1) is
/// in `first..=last`; every other call goes through.
pub struct OnCalls {
    operation: &'static str,
    first: usize,
    last: usize,
    fault: Fault,
    calls: AtomicUsize,
}

impl OnCalls {
    /// The `n`-th call of `operation`.
    pub fn nth(operation: &'static str, n: usize, fault: Fault) -> Arc<Self> {
        Arc::new(OnCalls { operation, first: n, last: n, fault, calls: AtomicUsize::new(0) })
    }

    /// Every call of `operation` from the `n`-th on.
    pub fn from(operation: &'static str, n: usize, fault: Fault) -> Arc<Self> {
        Arc::new(OnCalls { operation, first: n, last: usize::MAX, fault, calls: AtomicUsize::new(0) })
    }
}

impl FaultPlan for OnCalls {
    fn next(&self, operation: &'static str) -> Fault {
        if operation != self.operation {
            return Fault::None;
        }
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if (self.first..=self.last).contains(&call) { self.fault } else { Fault::None }
    }
}

/// Fails a share of calls at random (seeded), before they take effect, as
/// throttling or an outage does; switchable off.
pub struct RandomFailures {
    share: Mutex<f64>,
    rng: Mutex<StdRng>,
    pub injected: AtomicUsize,
}

impl RandomFailures {
    pub fn new(share: f64, seed: u64) -> Arc<Self> {
        Arc::new(RandomFailures {
            share: Mutex::new(share),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            injected: AtomicUsize::new(0),
        })
    }

    pub fn set_share(&self, share: f64) {
        *crate::lock(&self.share) = share;
    }
}

impl FaultPlan for RandomFailures {
    fn next(&self, _operation: &'static str) -> Fault {
        let share = *crate::lock(&self.share);
        let roll: f64 = crate::lock(&self.rng).random();
        if roll < share {
            self.injected.fetch_add(1, Ordering::SeqCst);
            Fault::FailBefore
        } else {
            Fault::None
        }
    }
}

/// Fails the next calls it is asked about, as many as [`FailNext::fail_next`]
/// says, then none.
#[derive(Default)]
pub struct FailNext {
    remaining: AtomicUsize,
}

impl FailNext {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    pub fn fail_next(&self, calls: usize) {
        self.remaining.store(calls, Ordering::SeqCst);
    }
}

impl FaultPlan for FailNext {
    fn next(&self, _operation: &'static str) -> Fault {
        let fail = self.remaining.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_ok();
        if fail { Fault::FailBefore } else { Fault::None }
    }
}

fn store_fault(operation: &'static str) -> StoreError {
    StoreError::Unavailable(Box::new(InjectedFault(operation)))
}

/// A store whose calls fail as its plan says.
pub type FaultyStore = Layered<dyn Store, Faults>;

/// Hooks that fail a store's calls as their plan says.
pub struct Faults {
    plan: Arc<dyn FaultPlan>,
}

impl Faults {
    /// `inner`, failing as `plan` says. A write whose answer is lost leaves
    /// the caller's copy as it was: it never learns of a write it did not
    /// see succeed.
    pub fn store(inner: Arc<dyn Store>, plan: Arc<dyn FaultPlan>) -> Arc<FaultyStore> {
        Arc::new(Layered::new(inner, Faults { plan }))
    }
}

#[async_trait]
impl Hooks for Faults {
    type Seen = Fault;
    const MAY_FAIL_AFTER: bool = true;

    async fn before(&self, call: Call<'_>) -> Result<Fault, StoreError> {
        match self.plan.next(call.name()) {
            Fault::FailBefore => Err(store_fault(call.name())),
            fault => Ok(fault),
        }
    }

    async fn after(&self, call: Call<'_>, fault: Fault, answer: Answer) -> Option<StoreError> {
        match (fault, call) {
            (Fault::None | Fault::FailBefore, _) => None,
            // A write that failed by itself answers its own error.
            (Fault::ConflictAfter, Call::Update(_) | Call::UpdateBatch(_)) if !answer.ok => None,
            (Fault::ConflictAfter, Call::Update(_) | Call::UpdateBatch(_)) => Some(StoreError::Conflict),
            (Fault::FailAfter | Fault::ConflictAfter, _) => Some(store_fault(call.name())),
        }
    }
}

/// A [`RunQueue`] whose sends fail as its plan says.
pub struct FaultyQueue {
    inner: Arc<dyn RunQueue>,
    plan: Arc<dyn FaultPlan>,
}

impl FaultyQueue {
    pub fn new(inner: Arc<dyn RunQueue>, plan: Arc<dyn FaultPlan>) -> Self {
        FaultyQueue { inner, plan }
    }
}

#[async_trait]
impl RunQueue for FaultyQueue {
    async fn enqueue(&self, message: &RunMessage) -> Result<(), QueueError> {
        let fault = |operation| QueueError::Unavailable(Box::new(InjectedFault(operation)));
        match self.plan.next("enqueue") {
            Fault::None => self.inner.enqueue(message).await,
            Fault::FailBefore => Err(fault("enqueue")),
            Fault::FailAfter | Fault::ConflictAfter => {
                let _ = self.inner.enqueue(message).await;
                Err(fault("enqueue"))
            }
        }
    }
}
