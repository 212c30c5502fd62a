//! Run metrics, read off the events every write of a run carries: a run
//! created, started for the first time (its queue wait), ended (outcome,
//! execution time, tokens, tool calls), an approval decided (how long it
//! waited). [`Measured`] hooks any run store and reports what its
//! successful writes committed, so every process and path counts the same
//! way: `agent-runs serve` keeps them for `GET /metrics` (Prometheus text),
//! a Lambda function prints CloudWatch Embedded Metric Format lines. The
//! spans those writes end (a run's, an approval wait's) are sent from here
//! too, for the same reason.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use agent_runs_domain::{AttemptOutcome, Clock, EventData, Resolver, Run, RunStatus, Timestamp};
use agent_runs_platform::telemetry;
use agent_runs_ports::store::{Answer, Call, Hooks, Layered, Store, StoreError};

/// One thing that happened to a run, as metrics count it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    Created,
    /// The first claim: how long the run waited in the queue.
    FirstStarted {
        queue_wait: Duration,
    },
    Finished {
        outcome: RunStatus,
        execution: Duration,
        input_tokens: u64,
        output_tokens: u64,
        tool_calls: u64,
    },
    ApprovalDecided {
        wait: Duration,
    },
    /// One attempt to deliver a webhook.
    WebhookAttempt {
        outcome: AttemptOutcome,
    },
}

/// The label of an attempt's outcome in metrics.
fn attempt_label(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Delivered => "delivered",
        AttemptOutcome::Gone => "gone",
        AttemptOutcome::Failed => "failed",
    }
}

const ATTEMPT_OUTCOMES: [AttemptOutcome; 3] = [AttemptOutcome::Delivered, AttemptOutcome::Failed, AttemptOutcome::Gone];

/// What the pending events of `run` (the run as it is about to be written)
/// say happened.
pub fn observations(run: &Run) -> Vec<Observation> {
    let between = |from: Timestamp, to: Timestamp| to.since(from);
    run.pending_events
        .iter()
        .filter_map(|event| match &event.data {
            EventData::RunCreated(_) => Some(Observation::Created),
            EventData::RunStarted { .. } if run.started_at == Some(event.at) => {
                Some(Observation::FirstStarted { queue_wait: between(run.created_at, event.at) })
            }
            EventData::RunSucceeded(_) | EventData::RunFailed(_) | EventData::RunCanceled(_) => {
                let usage = run.usage.unwrap_or_default();
                Some(Observation::Finished {
                    outcome: run.status,
                    execution: Duration::from_millis(run.execution_ms),
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    tool_calls: usage.tool_calls,
                })
            }
            // A person's wait; a rule decides at once, and a veto window's
            // end is nobody's.
            EventData::ApprovalDecided(approval)
                if !matches!(approval.resolved_by, Some(Resolver::Policy(_) | Resolver::Timeout)) =>
            {
                approval
                    .resolved_at
                    .map(|resolved| Observation::ApprovalDecided { wait: between(approval.requested_at, resolved) })
            }
            _ => None,
        })
        .collect()
}

/// Where observations go.
pub trait MetricsSink: Send + Sync + 'static {
    fn record(&self, observations: &[Observation]);
}

/// Seconds, the upper bounds of the histograms' buckets.
const BUCKETS: [f64; 12] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0, 21_600.0, 86_400.0];

#[derive(Default)]
struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(value.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", count.load(Ordering::Relaxed));
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

const OUTCOMES: [RunStatus; 3] = [RunStatus::Succeeded, RunStatus::Failed, RunStatus::Canceled];

/// The embedded server's metrics, rendered as Prometheus text.
#[derive(Default)]
pub struct Registry {
    created: AtomicU64,
    finished: [AtomicU64; 3],
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    tool_calls: AtomicU64,
    queue_wait: Histogram,
    execution: Histogram,
    approval_wait: Histogram,
    webhook_attempts: [AtomicU64; 3],
}

impl MetricsSink for Registry {
    fn record(&self, observations: &[Observation]) {
        for observation in observations {
            match *observation {
                Observation::Created => {
                    self.created.fetch_add(1, Ordering::Relaxed);
                }
                Observation::FirstStarted { queue_wait } => self.queue_wait.observe(queue_wait),
                Observation::Finished { outcome, execution, input_tokens, output_tokens, tool_calls } => {
                    if let Some(index) = OUTCOMES.iter().position(|known| *known == outcome) {
                        self.finished[index].fetch_add(1, Ordering::Relaxed);
                    }
                    self.execution.observe(execution);
                    self.input_tokens.fetch_add(input_tokens, Ordering::Relaxed);
                    self.output_tokens.fetch_add(output_tokens, Ordering::Relaxed);
                    self.tool_calls.fetch_add(tool_calls, Ordering::Relaxed);
                }
                Observation::ApprovalDecided { wait } => self.approval_wait.observe(wait),
                Observation::WebhookAttempt { outcome } => {
                    if let Some(index) = ATTEMPT_OUTCOMES.iter().position(|known| *known == outcome) {
                        self.webhook_attempts[index].fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

impl Registry {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, values: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in values {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        counter(&mut out, "agent_runs_created_total", "Runs created.", &[("", self.created.load(Ordering::Relaxed))]);
        let finished: Vec<(String, u64)> = OUTCOMES
            .iter()
            .zip(&self.finished)
            .map(|(outcome, count)| (format!("{{outcome=\"{}\"}}", outcome.as_str()), count.load(Ordering::Relaxed)))
            .collect();
        let finished: Vec<(&str, u64)> = finished.iter().map(|(labels, value)| (labels.as_str(), *value)).collect();
        counter(&mut out, "agent_runs_finished_total", "Runs ended, by outcome.", &finished);
        counter(
            &mut out,
            "agent_runs_tokens_total",
            "Model tokens used by runs that ended.",
            &[
                ("{kind=\"input\"}", self.input_tokens.load(Ordering::Relaxed)),
                ("{kind=\"output\"}", self.output_tokens.load(Ordering::Relaxed)),
            ],
        );
        counter(
            &mut out,
            "agent_runs_tool_calls_total",
            "Tool calls made by runs that ended.",
            &[("", self.tool_calls.load(Ordering::Relaxed))],
        );
        self.queue_wait.render(&mut out, "agent_runs_queue_wait_seconds", "From create to the first claim.");
        self.execution.render(&mut out, "agent_runs_execution_seconds", "Execution time of runs that ended.");
        self.approval_wait.render(&mut out, "agent_runs_approval_wait_seconds", "From request to decision.");
        let attempts: Vec<(String, u64)> = ATTEMPT_OUTCOMES
            .iter()
            .zip(&self.webhook_attempts)
            .map(|(outcome, count)| {
                (format!("{{result=\"{}\"}}", attempt_label(*outcome)), count.load(Ordering::Relaxed))
            })
            .collect();
        let attempts: Vec<(&str, u64)> = attempts.iter().map(|(labels, value)| (labels.as_str(), *value)).collect();
        counter(&mut out, "agent_runs_webhook_deliveries_total", "Webhook delivery attempts, by result.", &attempts);
        out
    }
}

/// CloudWatch Embedded Metric Format: one JSON line per observation on
/// stdout, which Lambda sends to the function's log group and CloudWatch
/// turns into metrics of the namespace `AgentRuns` (no API call).
pub struct EmfSink;

pub const EMF_NAMESPACE: &str = "AgentRuns";

/// The EMF line of one observation at `millis` (Unix time).
pub fn emf_line(observation: &Observation, millis: i64) -> String {
    // (name, unit, value) of each metric, and the dimensions they have.
    type Metrics = Vec<(&'static str, &'static str, f64)>;
    let (dimensions, values): (Vec<(&str, &str)>, Metrics) = match *observation {
        Observation::Created => (vec![], vec![("RunsCreated", "Count", 1.0)]),
        Observation::FirstStarted { queue_wait } => {
            (vec![], vec![("QueueWait", "Milliseconds", queue_wait.as_millis() as f64)])
        }
        Observation::Finished { outcome, execution, input_tokens, output_tokens, tool_calls } => (
            vec![("Outcome", outcome.as_str())],
            vec![
                ("RunsFinished", "Count", 1.0),
                ("ExecutionTime", "Milliseconds", execution.as_millis() as f64),
                ("InputTokens", "Count", input_tokens as f64),
                ("OutputTokens", "Count", output_tokens as f64),
                ("ToolCalls", "Count", tool_calls as f64),
            ],
        ),
        Observation::ApprovalDecided { wait } => {
            (vec![], vec![("ApprovalWait", "Milliseconds", wait.as_millis() as f64)])
        }
        Observation::WebhookAttempt { outcome } => {
            (vec![("Result", attempt_label(outcome))], vec![("WebhookDeliveries", "Count", 1.0)])
        }
    };
    let metrics: Vec<serde_json::Value> =
        values.iter().map(|(name, unit, _)| serde_json::json!({"Name": name, "Unit": unit})).collect();
    let dimension_names: Vec<&str> = dimensions.iter().map(|(name, _)| *name).collect();
    let mut line = serde_json::json!({
        "_aws": {
            "Timestamp": millis,
            "CloudWatchMetrics": [{"Namespace": EMF_NAMESPACE, "Dimensions": [dimension_names], "Metrics": metrics}]
        }
    });
    for (name, value) in dimensions {
        line[name] = value.into();
    }
    for (name, _, value) in values {
        line[name] = value.into();
    }
    line.to_string()
}

impl MetricsSink for EmfSink {
    fn record(&self, observations: &[Observation]) {
        let now = agent_runs_domain::SystemClock.now().millis();
        for observation in observations {
            println!("{}", emf_line(observation, now));
        }
    }
}

/// Reports what a store's writes committed: observations to `sink` (when
/// metrics are on) and the spans they end (when traces are).
pub struct Measured {
    sink: Option<Arc<dyn MetricsSink>>,
}

impl Measured {
    /// `inner`, measured when metrics or traces are on.
    pub fn wrap(inner: Arc<dyn Store>, sink: Option<Arc<dyn MetricsSink>>) -> Arc<dyn Store> {
        if sink.is_none() && !telemetry::enabled() {
            return inner;
        }
        Arc::new(Layered::new(inner, Measured { sink }))
    }
}

#[async_trait]
impl Hooks for Measured {
    /// Per run the call writes, what committing it tells.
    type Seen = Vec<(Vec<Observation>, Vec<telemetry::Ended>)>;

    async fn before(&self, call: Call<'_>) -> Result<Self::Seen, StoreError> {
        let seen = |run: &Run| (observations(run), telemetry::ended_by(run));
        Ok(match call {
            Call::Insert(run) | Call::Update(run) => vec![seen(run)],
            Call::UpdateBatch(runs) => runs.iter().map(seen).collect(),
            _ => Vec::new(),
        })
    }

    async fn after(&self, _call: Call<'_>, seen: Self::Seen, answer: Answer) -> Option<StoreError> {
        for (observed, ended) in seen.into_iter().take(answer.written) {
            if let Some(sink) = &self.sink {
                sink.record(&observed);
            }
            telemetry::send(ended);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use agent_runs_domain::{
        ApprovalId, ApprovalRequest, Decision, DecisionRequest, ExecutionPolicy, Owner as RunOwner, RunId, Usage,
    };

    const T0: i64 = 1_795_303_478_123;

    fn at(offset_ms: i64) -> Timestamp {
        Timestamp::from_millis(T0 + offset_ms)
    }

    /// The observations of each write of a run that waits for approval,
    /// is approved and succeeds with token usage.
    fn lifecycle() -> Vec<Vec<Observation>> {
        let policy = ExecutionPolicy::default();
        let id = RunId::from_ulid(ulid::Ulid::from_parts(T0 as u64, 1));
        let mut run =
            Run::new(id, RunOwner::parse("acme").unwrap(), "script".into(), "x".into(), BTreeMap::new(), &policy);
        let mut writes = Vec::new();
        let mut write = |run: &mut Run| {
            writes.push(observations(run));
            run.take_events();
        };
        write(&mut run);
        run.claim("w", at(2_000), &policy).unwrap();
        write(&mut run);
        let approval = ApprovalId::from_ulid(ulid::Ulid::from_parts(T0 as u64 + 2_100, 2));
        run.park("w", vec![(approval, ApprovalRequest::action("go"))], serde_json::json!({}), at(2_100), &policy)
            .unwrap();
        write(&mut run);
        let approve =
            DecisionRequest { decision: Decision::Approve, comment: None, seen_sha256: None, decided_by: None };
        run.decide(approval, approve, at(62_100), &policy).unwrap();
        write(&mut run);
        run.claim("w", at(63_000), &policy).unwrap();
        write(&mut run);
        run.usage = Some(Usage { input_tokens: 10, output_tokens: 5, total_tokens: 15, tool_calls: 2 });
        run.succeed("w", "done".into(), None, at(63_500)).unwrap();
        write(&mut run);
        writes
    }

    #[test]
    fn each_write_reports_what_its_events_say_happened() {
        let writes = lifecycle();
        assert_eq!(writes[0], [Observation::Created]);
        assert_eq!(writes[1], [Observation::FirstStarted { queue_wait: Duration::from_secs(2) }]);
        assert!(writes[2].is_empty(), "a park is no observation");
        assert_eq!(writes[3], [Observation::ApprovalDecided { wait: Duration::from_secs(60) }]);
        assert!(writes[4].is_empty(), "a second start is not a queue wait from the create");
        assert_eq!(
            writes[5],
            [Observation::Finished {
                outcome: RunStatus::Succeeded,
                execution: Duration::from_millis(600),
                input_tokens: 10,
                output_tokens: 5,
                tool_calls: 2
            }]
        );
    }

    #[test]
    fn the_registry_renders_prometheus_text() {
        let registry = Registry::default();
        for observed in lifecycle() {
            registry.record(&observed);
        }
        let delivered = Observation::WebhookAttempt { outcome: AttemptOutcome::Delivered };
        registry.record(&[delivered, delivered, Observation::WebhookAttempt { outcome: AttemptOutcome::Gone }]);
        let text = registry.render();
        for line in [
            "agent_runs_created_total 1",
            "agent_runs_finished_total{outcome=\"succeeded\"} 1",
            "agent_runs_finished_total{outcome=\"failed\"} 0",
            "agent_runs_tokens_total{kind=\"input\"} 10",
            "agent_runs_tool_calls_total 2",
            "agent_runs_approval_wait_seconds_bucket{le=\"10\"} 0",
            "agent_runs_approval_wait_seconds_bucket{le=\"60\"} 1",
            "agent_runs_approval_wait_seconds_sum 60",
            "agent_runs_queue_wait_seconds_count 1",
            "agent_runs_webhook_deliveries_total{result=\"delivered\"} 2",
            "agent_runs_webhook_deliveries_total{result=\"gone\"} 1",
            "agent_runs_webhook_deliveries_total{result=\"failed\"} 0",
        ] {
            assert!(text.lines().any(|candidate| candidate == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn emf_lines_name_their_metrics_units_and_dimensions() {
        let finished = Observation::Finished {
            outcome: RunStatus::Failed,
            execution: Duration::from_millis(1_500),
            input_tokens: 3,
            output_tokens: 4,
            tool_calls: 1,
        };
        let line: serde_json::Value = serde_json::from_str(&emf_line(&finished, T0)).unwrap();
        let directive = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!((&line["_aws"]["Timestamp"], &directive["Namespace"]), (&T0.into(), &EMF_NAMESPACE.into()));
        assert_eq!(directive["Dimensions"], serde_json::json!([["Outcome"]]));
        assert_eq!(line["Outcome"], "failed");
        assert_eq!(
            (&line["RunsFinished"], &line["ExecutionTime"], &line["ToolCalls"]),
            (&1.0.into(), &1500.0.into(), &1.0.into())
        );
        let names: Vec<&str> =
            directive["Metrics"].as_array().unwrap().iter().map(|m| m["Name"].as_str().unwrap()).collect();
        for name in &names {
            assert!(line.get(*name).is_some(), "{name} has a value");
        }
        let attempt = Observation::WebhookAttempt { outcome: AttemptOutcome::Failed };
        let line: serde_json::Value = serde_json::from_str(&emf_line(&attempt, T0)).unwrap();
        assert_eq!(line["_aws"]["CloudWatchMetrics"][0]["Dimensions"], serde_json::json!([["Result"]]));
        assert_eq!((&line["Result"], &line["WebhookDeliveries"]), (&"failed".into(), &1.0.into()));
    }
}
