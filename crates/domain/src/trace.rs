//! Where a run sits in a distributed trace: W3C Trace Context ids, kept
//! with the run so that every process that works on it (the API that
//! created it, workers, whoever decides or cancels it) adds its spans to
//! the run's one trace.

use rand::Rng;

use crate::ids::RunId;

/// A span another span can be the child of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanParent {
    pub trace_id: u128,
    pub span_id: u64,
    /// Whether the trace is recorded (the W3C `sampled` flag).
    pub sampled: bool,
}

/// A run's trace: its id, the id of the span that stands for the whole
/// run, and that span's parent (the request that created the run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunTrace {
    pub trace_id: u128,
    pub span_id: u64,
    pub parent_span_id: Option<u64>,
    pub sampled: bool,
}

impl RunTrace {
    /// The trace of a run created under `request` (the create request's span).
    pub fn under(request: SpanParent) -> RunTrace {
        RunTrace {
            trace_id: request.trace_id,
            span_id: new_span_id(),
            parent_span_id: Some(request.span_id),
            sampled: request.sampled,
        }
    }

    /// A run stored before runs had traces: ids derived from its own, so
    /// the same run always has the same trace.
    pub fn derived(run_id: RunId) -> RunTrace {
        let id = u128::from(run_id.ulid());
        RunTrace { trace_id: id, span_id: (id as u64).max(1), parent_span_id: None, sampled: true }
    }

    /// The run's span, as a parent of the spans of its attempts, approvals
    /// and the requests that change it.
    pub fn as_parent(&self) -> SpanParent {
        SpanParent { trace_id: self.trace_id, span_id: self.span_id, sampled: self.sampled }
    }

    pub fn trace_id_hex(&self) -> String {
        format!("{:032x}", self.trace_id)
    }
}

/// A random, valid (non-zero) span id.
pub fn new_span_id() -> u64 {
    rand::rng().random_range(1..=u64::MAX)
}

/// A random, valid (non-zero) trace id.
pub fn new_trace_id() -> u128 {
    rand::rng().random_range(1..=u128::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_under_a_request_shares_its_trace_and_has_a_span_of_its_own() {
        let request = SpanParent { trace_id: 7, span_id: 9, sampled: false };
        let trace = RunTrace::under(request);
        assert_eq!((trace.trace_id, trace.parent_span_id, trace.sampled), (7, Some(9), false));
        assert_ne!(trace.span_id, 0);
        assert_ne!(trace.span_id, 9);
        assert_eq!(trace.as_parent(), SpanParent { trace_id: 7, span_id: trace.span_id, sampled: false });
        assert_eq!(RunTrace { trace_id: 0xab, ..trace }.trace_id_hex(), format!("{:0>32}", "ab"));
    }

    #[test]
    fn an_older_run_always_gets_the_same_trace() {
        let id: RunId = "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9".parse().unwrap();
        assert_eq!(RunTrace::derived(id), RunTrace::derived(id));
        assert_eq!(RunTrace::derived(id).trace_id, u128::from(id.ulid()));
    }
}
