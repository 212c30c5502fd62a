//! Traces: OpenTelemetry spans, exported over OTLP (HTTP/protobuf) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
//! set, and not even built otherwise.
//!
//! A run's trace outlives any one process: the request that creates it,
//! the workers of each attempt (on Lambda, other functions, minutes
//! later), the person who decides its approval. So the spans are made
//! here from ids kept with the run ([`RunTrace`]) rather than by the SDK's
//! tracer, which gives every span a fresh id and cannot end a span that
//! another process started: the run's own span is written when its end is
//! committed, with its stored id and its creation as start. The SDK's
//! batch processor and the OTLP exporter send them.

use std::borrow::Cow;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
pub use opentelemetry::trace::SpanKind;
use opentelemetry::trace::{SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanEvents, SpanLinks, SpanProcessor};

use agent_runs_domain::{Approval, EventData, Run, SpanParent, Timestamp, new_span_id, new_trace_id};

/// Whether and how traces are exported (read by `config.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TracesConfig {
    /// An OTLP endpoint is configured: the exporter reads it, and the
    /// headers, itself.
    pub export: bool,
    /// `service.name` of the spans.
    pub service_name: String,
    /// The Lambda function's name, on Lambda.
    pub function_name: Option<String>,
    /// How long one export may take.
    pub timeout: Duration,
    pub sampler: Sampler,
}

/// Which new traces are recorded (`OTEL_TRACES_SAMPLER`): `ratio` of them,
/// chosen by trace id; with `parent_based`, a caller's `traceparent`
/// decides for its own trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    pub ratio: f64,
    pub parent_based: bool,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler { ratio: 1.0, parent_based: true }
    }
}

impl Sampler {
    fn samples(&self, trace_id: u128, caller: Option<SpanParent>) -> bool {
        match caller {
            Some(caller) if self.parent_based => caller.sampled,
            // As the SDK's TraceIdRatioBased: the low 64 bits, compared.
            _ => ((trace_id as u64) >> 1) < (self.ratio.clamp(0.0, 1.0) * (u64::MAX >> 1) as f64) as u64,
        }
    }
}

struct Exporter {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    sampler: Sampler,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("traces need a Tokio runtime to send from")]
    NoRuntime,
    #[error("the OTLP exporter's HTTP client could not be set up")]
    Client(#[source] reqwest::Error),
    #[error("the OTLP exporter could not be set up")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// Starts exporting spans, if `config` asks for it; once per process.
pub fn init(config: &TracesConfig) -> Result<(), TelemetryError> {
    if !config.export || EXPORTER.get().is_some() {
        return Ok(());
    }
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
    crate::aws_sdk::use_ring_for_rustls();
    // The exporter stops retrying at its timeout but cannot cut a request
    // short: the client does.
    let client = reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(config.timeout.min(CONNECT_TIMEOUT))
        .build()
        .map_err(TelemetryError::Client)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient { client, runtime })
        .with_timeout(config.timeout)
        .build()
        .map_err(TelemetryError::Exporter)?;
    let mut resource = Resource::builder().with_service_name(config.service_name.clone());
    if let Some(function) = &config.function_name {
        resource = resource
            .with_attributes([KeyValue::new("cloud.provider", "aws"), KeyValue::new("faas.name", function.clone())]);
    }
    let mut processor = BatchSpanProcessor::builder(exporter).build();
    processor.set_resource(&resource.build());
    let scope = InstrumentationScope::builder("agent-runs").with_version(env!("CARGO_PKG_VERSION")).build();
    let _ = EXPORTER.set(Exporter { processor, scope, sampler: config.sampler });
    tracing::info!("exporting traces over OTLP");
    Ok(())
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest a Lambda invocation waits for its spans to be sent.
const FLUSH_LIMIT: Duration = Duration::from_secs(1);

/// The longest text of an attribute, in bytes: paths, actions and errors
/// can be long (and are the operator's data, not the run's output).
const MAX_ATTRIBUTE_BYTES: usize = 1_024;

/// Whether spans are exported: when not, none is made.
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Sends every span ended so far; a Lambda function calls it after each
/// invocation, before it may be frozen, and waits for it at most until
/// shortly before `deadline` (the invocation's), and at most
/// [`FLUSH_LIMIT`]. After a send that did not finish in time, later calls
/// do not wait until one has finished: a collector that is down must not
/// cost every invocation.
pub async fn flush(deadline: Option<SystemTime>) {
    // One send at a time: a call while one is under way leaves its spans
    // to the next.
    if !enabled() || FLUSHING.swap(true, Ordering::AcqRel) {
        return;
    }
    let flushed = tokio::task::spawn_blocking(|| {
        let result = EXPORTER.get().map(|exporter| exporter.processor.force_flush());
        if matches!(result, Some(Ok(()))) {
            FLUSH_BEHIND.store(false, Ordering::Relaxed);
        }
        FLUSHING.store(false, Ordering::Release);
        result
    });
    if FLUSH_BEHIND.load(Ordering::Relaxed) {
        return;
    }
    let left = deadline.map_or(FLUSH_LIMIT, |deadline| {
        deadline.duration_since(SystemTime::now()).unwrap_or_default().saturating_sub(FLUSH_DEADLINE_MARGIN)
    });
    match tokio::time::timeout(left.min(FLUSH_LIMIT), flushed).await {
        Ok(Ok(Some(Err(error)))) => tracing::warn!(%error, "spans could not be sent"),
        Err(_) => {
            FLUSH_BEHIND.store(true, Ordering::Relaxed);
            tracing::warn!("spans were not sent in time; later invocations do not wait for them until a send succeeds");
        }
        _ => {}
    }
}

/// A flush did not finish in time, and none has since.
static FLUSH_BEHIND: AtomicBool = AtomicBool::new(false);
static FLUSHING: AtomicBool = AtomicBool::new(false);

/// Left of an invocation's time for answering after its flush.
const FLUSH_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

/// Sends what is left, at the end of the process.
pub async fn shutdown() {
    if enabled() {
        let _ = tokio::task::spawn_blocking(|| EXPORTER.get().map(|exporter| exporter.processor.shutdown())).await;
    }
}

/// The exporter's HTTP client: the process's reqwest, on its runtime (the
/// batch processor sends from a thread of its own, outside the runtime).
#[derive(Debug)]
struct OtlpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let response = client.execute(reqwest::Request::try_from(request)?).await?;
            let mut answer = http::Response::new(Bytes::new());
            *answer.status_mut() = response.status();
            *answer.headers_mut() = response.headers().clone();
            *answer.body_mut() = response.bytes().await?;
            Ok::<_, opentelemetry_http::HttpError>(answer)
        });
        sent.await?
    }
}

/// The caller's span from a W3C `traceparent` header, if it has a valid one.
pub fn traceparent(headers: &http::HeaderMap) -> Option<SpanParent> {
    let mut values = headers.get_all("traceparent").iter();
    // Two of them are as good as none (W3C Trace Context).
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let value = value.to_str().ok()?;
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex =
        |text: &str, len: usize| text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    // Version 00 has exactly four fields; a later version may add more.
    if !hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace, 16).ok().filter(|id| *id != 0)?;
    let span_id = u64::from_str_radix(span, 16).ok().filter(|id| *id != 0)?;
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1 == 1;
    Some(SpanParent { trace_id, span_id, sampled })
}

/// The span of one request: a child of the caller's span, or the root of
/// a new trace. Its id is known from the start (a run created by the
/// request is its child), even when spans are not exported.
pub fn request_span_ids(caller: Option<SpanParent>) -> (SpanParent, Option<u64>) {
    let trace_id = caller.map_or_else(new_trace_id, |caller| caller.trace_id);
    // Without an exporter nothing is decided: a run created now is
    // recorded if spans are exported later (unless its caller said not to).
    let sampled = match EXPORTER.get() {
        Some(exporter) => exporter.sampler.samples(trace_id, caller),
        None => caller.is_none_or(|caller| caller.sampled),
    };
    (SpanParent { trace_id, span_id: new_span_id(), sampled }, caller.map(|caller| caller.span_id))
}

tokio::task_local! {
    /// The span that model and tool calls made here are children of.
    static CURRENT: SpanParent;
}

/// Runs `future` with `parent` as the span of the calls it makes.
pub async fn within<F: Future>(parent: Option<SpanParent>, future: F) -> F::Output {
    match parent {
        Some(parent) => CURRENT.scope(parent, future).await,
        None => future.await,
    }
}

/// The span calls made now are children of, when spans are exported.
pub fn current() -> Option<SpanParent> {
    CURRENT.try_with(|parent| *parent).ok()
}

/// A span being recorded: ended (and sent) by [`Span::end`].
#[derive(Debug)]
pub struct Span {
    trace_id: u128,
    id: u64,
    parent_id: Option<u64>,
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    error: Option<String>,
}

impl Span {
    /// A span starting now, as a child of `parent`; `None` when spans are
    /// not exported or the trace is not sampled.
    pub fn child_of(parent: SpanParent, name: impl Into<Cow<'static, str>>, kind: SpanKind) -> Option<Span> {
        Span::with_id(parent.trace_id, new_span_id(), Some(parent.span_id), parent.sampled, name, kind)
    }

    /// A span of the given ids, starting now; `None` as for [`Span::child_of`].
    pub fn with_id(
        trace_id: u128,
        id: u64,
        parent_id: Option<u64>,
        sampled: bool,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
    ) -> Option<Span> {
        (enabled() && sampled).then(|| Span {
            trace_id,
            id,
            parent_id,
            name: name.into(),
            kind,
            start: SystemTime::now(),
            attributes: Vec::new(),
            error: None,
        })
    }

    /// This span, as a parent.
    pub fn as_parent(&self) -> SpanParent {
        SpanParent { trace_id: self.trace_id, span_id: self.id, sampled: true }
    }

    /// The span moved into `parent`'s trace, as its child; `None` when
    /// that trace is not sampled.
    pub fn in_trace(mut self, parent: SpanParent) -> Option<Span> {
        (self.trace_id, self.parent_id) = (parent.trace_id, Some(parent.span_id));
        parent.sampled.then_some(self)
    }

    pub fn started_at(mut self, at: Timestamp) -> Span {
        self.start = at.to_system_time();
        self
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        let value = match value.into() {
            Value::String(text) if text.as_str().len() > MAX_ATTRIBUTE_BYTES => Value::from(clipped(text.as_str())),
            value => value,
        };
        self.attributes.push(KeyValue::new(key, value));
    }

    pub fn set_strings(&mut self, key: &'static str, values: &[&'static str]) {
        let values: Vec<opentelemetry::StringValue> = values.iter().map(|value| (*value).into()).collect();
        self.attributes.push(KeyValue::new(key, Value::Array(opentelemetry::Array::from(values))));
    }

    /// Marks the span failed, with `error.type` (a short, fixed kind).
    pub fn fail(&mut self, error_type: &'static str, message: impl Into<String>) {
        self.set("error.type", error_type);
        self.error = Some(clipped(&message.into()));
    }

    pub fn end(self) {
        self.end_at(SystemTime::now());
    }

    pub fn end_at(self, end: SystemTime) {
        let Some(exporter) = EXPORTER.get() else {
            return;
        };
        let flags = TraceFlags::SAMPLED;
        exporter.processor.on_end(SpanData {
            span_context: SpanContext::new(
                TraceId::from(self.trace_id),
                SpanId::from(self.id),
                flags,
                false,
                TraceState::NONE,
            ),
            parent_span_id: self.parent_id.map_or(SpanId::INVALID, SpanId::from),
            parent_span_is_remote: self.parent_id.is_some(),
            span_kind: self.kind,
            name: self.name,
            start_time: self.start,
            end_time: end.max(self.start),
            attributes: self.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: match self.error {
                Some(message) => Status::error(message),
                None => Status::Unset,
            },
            instrumentation_scope: exporter.scope.clone(),
        });
    }
}

fn clipped(text: &str) -> String {
    text[..text.floor_char_boundary(MAX_ATTRIBUTE_BYTES)].to_owned()
}

/// A span and its end, to be sent once the write that ends it committed.
pub type Ended = (Span, SystemTime);

/// Sends spans whose ends were committed.
pub fn send(ended: Vec<Ended>) {
    for (span, end) in ended {
        span.end_at(end);
    }
}

/// The spans a write of `run` (as about to be written) ends: the run's own
/// when it ends, and each approval's wait when it is decided, expires or is
/// canceled. Empty when spans are not exported.
pub fn ended_by(run: &Run) -> Vec<Ended> {
    if !enabled() {
        return Vec::new();
    }
    let trace = run.trace();
    let mut spans = Vec::new();
    for event in &run.pending_events {
        match &event.data {
            EventData::ApprovalDecided(approval)
            | EventData::ApprovalExpired(approval)
            | EventData::ApprovalCanceled(approval) => {
                spans.extend(approval_wait(trace.as_parent(), run, approval, event.at));
            }
            EventData::RunSucceeded(_) | EventData::RunFailed(_) | EventData::RunCanceled(_) => {
                let Some(mut span) = Span::with_id(
                    trace.trace_id,
                    trace.span_id,
                    trace.parent_span_id,
                    trace.sampled,
                    format!("invoke_agent {}", run.agent),
                    SpanKind::Internal,
                ) else {
                    continue;
                };
                span = span.started_at(run.created_at);
                span.set("gen_ai.operation.name", "invoke_agent");
                span.set("gen_ai.agent.name", run.agent.clone());
                span.set("gen_ai.conversation.id", run.id.to_string());
                span.set("agent_runs.run.id", run.id.to_string());
                span.set("agent_runs.run.status", run.status.as_str());
                span.set("agent_runs.run.attempts", i64::from(run.attempts));
                if let Some(usage) = run.usage {
                    span.set("gen_ai.usage.input_tokens", usage.input_tokens as i64);
                    span.set("gen_ai.usage.output_tokens", usage.output_tokens as i64);
                    span.set("agent_runs.usage.tool_calls", usage.tool_calls as i64);
                }
                if let Some(error) = &run.error {
                    span.fail("run_failed", error.clone());
                }
                spans.push((span, run.completed_at.unwrap_or(event.at).to_system_time()));
            }
            _ => {}
        }
    }
    spans
}

fn approval_wait(parent: SpanParent, run: &Run, approval: &Approval, at: Timestamp) -> Option<Ended> {
    let mut span = Span::child_of(parent, "approval wait", SpanKind::Internal)?.started_at(approval.requested_at);
    span.set("agent_runs.run.id", run.id.to_string());
    span.set("agent_runs.approval.id", approval.id.to_string());
    span.set("agent_runs.approval.action", approval.action.clone());
    span.set("agent_runs.approval.status", approval.status.as_str());
    if let Some(call) = &approval.call {
        span.set("gen_ai.tool.name", call.tool.clone());
    }
    if let Some(resolver) = &approval.resolved_by {
        span.set("agent_runs.approval.resolved_by", resolver.to_string());
    }
    Some((span, approval.resolved_at.unwrap_or(at).to_system_time()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(header: &str) -> Option<SpanParent> {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", header.parse().unwrap());
        traceparent(&headers)
    }

    #[test]
    fn a_traceparent_is_taken_only_when_well_formed() {
        let good = parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(
            good,
            SpanParent { trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736, span_id: 0x00f067aa0ba902b7, sampled: true }
        );
        assert!(!parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled);
        // A later version may add fields; version 00 may not.
        assert!(parent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more").is_some());
        for bad in [
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "garbage",
        ] {
            assert_eq!(parent(bad), None, "{bad}");
        }
        let mut twice = http::HeaderMap::new();
        twice.append("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
        twice.append("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap());
        assert_eq!(traceparent(&twice), None, "two are as good as none");
    }

    #[test]
    fn the_sampler_keeps_a_ratio_of_new_traces_and_follows_a_callers_choice() {
        let half = Sampler { ratio: 0.5, parent_based: true };
        let kept = (0..10_000).filter(|_| half.samples(new_trace_id(), None)).count();
        assert!((4_500..5_500).contains(&kept), "{kept}");
        let caller = |sampled| Some(SpanParent { trace_id: 1, span_id: 1, sampled });
        let never = Sampler { ratio: 0.0, parent_based: true };
        assert!(never.samples(1, caller(true)) && !Sampler::default().samples(1, caller(false)));
        assert!(!Sampler { ratio: 0.0, parent_based: false }.samples(new_trace_id(), caller(true)));
        assert!(Sampler::default().samples(u128::MAX, None));
    }

    #[test]
    fn long_texts_are_clipped_on_a_character_boundary() {
        let text = "é".repeat(MAX_ATTRIBUTE_BYTES);
        let clipped = clipped(&text);
        assert!(clipped.len() <= MAX_ATTRIBUTE_BYTES && clipped.len() >= MAX_ATTRIBUTE_BYTES - 1);
        assert!(text.starts_with(&clipped));
    }
}
