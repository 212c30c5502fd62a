//! Settings read from the environment, in one place.

use std::time::Duration;

use crate::api::{ApiLimits, HoldLimits, RateLimit};
use agent_runs_domain::{ExecutionPolicy, MAX_TOOL_TIMEOUT_MS};
use agent_runs_platform::telemetry::{Sampler, TracesConfig};
use agent_runs_ports::store::{EVENT_FORMAT, EventFormat, MAX_CHECKPOINT_BYTES, RENDERED_FORMAT};
use agent_runs_ports::views::ExtraFields;

/// A worker stops taking steps this long before its Lambda deadline: enough
/// for a tool call in flight to end (at most [`MAX_TOOL_TIMEOUT_MS`]) and
/// its outcome to be written.
pub const MIN_WORKER_DEADLINE_MARGIN_MS: u64 = MAX_TOOL_TIMEOUT_MS + 10_000;

#[derive(Debug, thiserror::Error)]
#[error("{name}: {problem}")]
pub struct ConfigError {
    name: &'static str,
    problem: String,
}

/// What every way of running shares: agents, limits and execution timings,
/// and where the AWS resources are when running on them.
#[derive(Debug, Clone)]
pub struct Config {
    pub default_agent: String,
    pub limits: ApiLimits,
    pub policy: ExecutionPolicy,
    /// `AGENT_RUNS_TABLE`: the DynamoDB table; set on the AWS path.
    pub table: Option<String>,
    /// `AGENT_RUNS_QUEUE_URL`: the SQS queue of run ids.
    pub queue_url: Option<String>,
    /// How long before the Lambda deadline a worker hands its run back.
    pub worker_deadline_margin: Duration,
    /// `AGENT_RUNS_KEY_CACHE_SECS`: how long a verified API key is trusted
    /// without a lookup (at most 60); each way of running has its default.
    pub key_cache: Option<Duration>,
    /// `AGENT_RUNS_AGENT_CACHE_SECS`: how long a defined agent is used
    /// without reading its definition again (at most 300).
    pub agent_cache: Option<Duration>,
    /// `AGENT_RUNS_MAX_CHECKPOINT_BYTES`: the largest transcript a defined
    /// agent's run may keep; the run fails beyond it.
    pub max_checkpoint_bytes: usize,
    /// `AGENT_RUNS_EMF_METRICS=true`: print run metrics as CloudWatch
    /// Embedded Metric Format lines (template.yaml sets it on Lambda).
    pub emf_metrics: bool,
    /// `AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE=true`: webhook URLs may be `http`
    /// and reach loopback, private and link-local addresses (local
    /// development and tests only).
    pub webhook_allow_private: bool,
    /// `AGENT_RUNS_WEBHOOK_QUEUE_URL`: the SQS queue of webhook deliveries
    /// (the notifier and delivery functions on AWS).
    pub webhook_queue_url: Option<String>,
    /// `AGENT_RUNS_ISSUER`: the `iss` of approval receipts; each way of
    /// running has its default (the embedded server's base URL).
    pub issuer: Option<String>,
    /// `AGENT_RUNS_RECEIPT_KEY_ID`: the KMS key (ECC_NIST_P256) that signs
    /// approval receipts on AWS (the worker's; template.yaml sets it).
    pub receipt_key_id: Option<String>,
    /// Traces, from the standard OpenTelemetry variables (docs/operations.md).
    pub traces: TracesConfig,
    /// `AGENT_RUNS_EVENT_FORMAT`: `2` (the stored record, rendered on read)
    /// or `1` (the JSON clients get, rendered at write), on DynamoDB: `1`
    /// for a deploy over a release from before 2026-11-26 (docs/operations.md).
    pub event_format: EventFormat,
}

fn read<T: std::str::FromStr>(
    env: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, ConfigError> {
    match env(name) {
        None => Ok(default),
        Some(text) if text.trim().is_empty() => Ok(default),
        Some(text) => text.trim().parse().map_err(|_| ConfigError { name, problem: format!("cannot parse {text:?}") }),
    }
}

/// A number of seconds, at most `max`, or `None` when the variable is unset
/// (each way of running then has its own default).
fn optional_secs(
    env: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    max: u64,
) -> Result<Option<Duration>, ConfigError> {
    env(name).map(|_| read(env, name, 0u64)).transpose().map(|secs| secs.map(|secs| Duration::from_secs(secs.min(max))))
}

/// Spans are exported when an OTLP endpoint is set, unless the SDK or the
/// traces exporter is switched off; the exporter reads the endpoint, headers
/// and timeout variables itself.
fn traces(env: &impl Fn(&str) -> Option<String>) -> Result<TracesConfig, ConfigError> {
    let set = |name| env(name).filter(|value: &String| !value.trim().is_empty());
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let disabled = set("OTEL_SDK_DISABLED").is_some_and(|value| value.trim().eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|exporter| exporter.trim() == "none");
    let export = endpoint.is_some() && !disabled;
    let service_name = set("OTEL_SERVICE_NAME").unwrap_or_else(|| "agent-runs".into());
    let function_name = set("AWS_LAMBDA_FUNCTION_NAME");
    if !export {
        // Not exporting: settings meant for a tracing set-up elsewhere on
        // the platform must not stop the service.
        let (timeout, sampler) = (Duration::from_secs(10), Sampler::default());
        return Ok(TracesConfig { export, service_name, function_name, timeout, sampler });
    }
    for name in ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"] {
        if let Some(protocol) = set(name).filter(|protocol| protocol.trim() != "http/protobuf") {
            return Err(ConfigError {
                name,
                problem: format!("{protocol:?} is not supported: spans are sent as http/protobuf"),
            });
        }
    }
    let timeout_name = if set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
    } else {
        "OTEL_EXPORTER_OTLP_TIMEOUT"
    };
    let ratio = read(env, "OTEL_TRACES_SAMPLER_ARG", 1.0f64)?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(ConfigError { name: "OTEL_TRACES_SAMPLER_ARG", problem: "must be a ratio from 0 to 1".into() });
    }
    let sampler = match set("OTEL_TRACES_SAMPLER").as_deref().map(str::trim).unwrap_or("parentbased_always_on") {
        "always_on" => Sampler { ratio: 1.0, parent_based: false },
        "always_off" => Sampler { ratio: 0.0, parent_based: false },
        "traceidratio" => Sampler { ratio, parent_based: false },
        "parentbased_always_on" => Sampler { ratio: 1.0, parent_based: true },
        "parentbased_always_off" => Sampler { ratio: 0.0, parent_based: true },
        "parentbased_traceidratio" => Sampler { ratio, parent_based: true },
        other => {
            return Err(ConfigError {
                name: "OTEL_TRACES_SAMPLER",
                problem: format!(
                    "{other:?} is not supported (always_on, always_off, traceidratio and their parentbased_ forms are)"
                ),
            });
        }
    };
    let timeout = Duration::from_millis(read(env, timeout_name, 10_000u64)?.max(1));
    Ok(TracesConfig { export, service_name, function_name, timeout, sampler })
}

impl Config {
    /// What runs show beyond the contract's keys: `trace_id` where traces
    /// are exported.
    pub fn shown(&self) -> ExtraFields {
        ExtraFields { trace_ids: self.traces.export }
    }

    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `env`, so tests need not touch the process environment.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let defaults = ExecutionPolicy::default();
        let rate = RateLimit::default();
        let holds = HoldLimits::default();
        let mut config = Config {
            default_agent: read(&env, "AGENT_RUNS_DEFAULT_AGENT", "echo".to_owned())?,
            limits: ApiLimits {
                max_active_runs: read(&env, "AGENT_RUNS_MAX_ACTIVE_RUNS", ApiLimits::default().max_active_runs)?,
                rate: RateLimit {
                    per_second: read(&env, "AGENT_RUNS_RATE_LIMIT_PER_SECOND", rate.per_second)?,
                    burst: read(&env, "AGENT_RUNS_RATE_LIMIT_BURST", rate.burst)?,
                },
                holds: HoldLimits {
                    per_owner: read(&env, "AGENT_RUNS_MAX_HELD_PER_OWNER", holds.per_owner)?,
                    total: holds.total,
                    stream_lifetime: Duration::from_secs(read(
                        &env,
                        "AGENT_RUNS_STREAM_MAX_SECS",
                        holds.stream_lifetime.as_secs(),
                    )?),
                    max_wait: Duration::from_secs(
                        read(&env, "AGENT_RUNS_MAX_WAIT_SECS", holds.max_wait.as_secs())?
                            .min(crate::api::MAX_WAIT_SECS),
                    ),
                },
            },
            policy: ExecutionPolicy {
                lease: Duration::from_millis(read(&env, "AGENT_RUNS_LEASE_MS", defaults.lease.as_millis() as u64)?),
                requeue_after: Duration::from_millis(read(
                    &env,
                    "AGENT_RUNS_REQUEUE_AFTER_MS",
                    defaults.requeue_after.as_millis() as u64,
                )?),
                max_attempts: read(&env, "AGENT_RUNS_MAX_ATTEMPTS", defaults.max_attempts)?,
                approval_timeout: Duration::from_secs(read(
                    &env,
                    "AGENT_RUNS_APPROVAL_TIMEOUT_SECS",
                    defaults.approval_timeout.as_secs(),
                )?),
                max_run_time: Duration::from_secs(read(
                    &env,
                    "AGENT_RUNS_MAX_RUN_SECS",
                    defaults.max_run_time.as_secs(),
                )?),
                approval_warning: defaults.approval_warning,
                max_events: read(&env, "AGENT_RUNS_MAX_EVENTS_PER_RUN", defaults.max_events)?,
            },
            table: env("AGENT_RUNS_TABLE").filter(|table| !table.trim().is_empty()),
            queue_url: env("AGENT_RUNS_QUEUE_URL").filter(|url| !url.trim().is_empty()),
            worker_deadline_margin: Duration::from_millis(read(
                &env,
                "AGENT_RUNS_WORKER_DEADLINE_MARGIN_MS",
                MIN_WORKER_DEADLINE_MARGIN_MS,
            )?),
            key_cache: optional_secs(&env, "AGENT_RUNS_KEY_CACHE_SECS", 60)?,
            agent_cache: optional_secs(&env, "AGENT_RUNS_AGENT_CACHE_SECS", 300)?,
            max_checkpoint_bytes: read(
                &env,
                "AGENT_RUNS_MAX_CHECKPOINT_BYTES",
                agent_runs_agents::llm::DEFAULT_MAX_CHECKPOINT_BYTES,
            )?,
            emf_metrics: read(&env, "AGENT_RUNS_EMF_METRICS", false)?,
            webhook_allow_private: read(&env, "AGENT_RUNS_WEBHOOK_ALLOW_PRIVATE", false)?,
            webhook_queue_url: env("AGENT_RUNS_WEBHOOK_QUEUE_URL").filter(|url| !url.trim().is_empty()),
            issuer: env("AGENT_RUNS_ISSUER").map(|issuer| issuer.trim().to_owned()).filter(|issuer| !issuer.is_empty()),
            receipt_key_id: env("AGENT_RUNS_RECEIPT_KEY_ID").filter(|id| !id.trim().is_empty()),
            traces: traces(&env)?,
            event_format: match read(&env, "AGENT_RUNS_EVENT_FORMAT", EVENT_FORMAT)? {
                EVENT_FORMAT => EventFormat::Record,
                RENDERED_FORMAT => EventFormat::Rendered,
                _ => {
                    return Err(ConfigError { name: "AGENT_RUNS_EVENT_FORMAT", problem: "must be 1 or 2".into() });
                }
            },
        };
        if !(1_024..=MAX_CHECKPOINT_BYTES).contains(&config.max_checkpoint_bytes) {
            return Err(ConfigError {
                name: "AGENT_RUNS_MAX_CHECKPOINT_BYTES",
                problem: format!("must be 1024 to {MAX_CHECKPOINT_BYTES} (what one DynamoDB item holds)"),
            });
        }
        // The warning comes an hour before an approval expires, or a tenth
        // of the timeout before when that is shorter, unless set.
        config.policy.approval_warning = match optional_secs(&env, "AGENT_RUNS_APPROVAL_WARNING_SECS", u64::MAX)? {
            Some(warning) => warning.min(config.policy.approval_timeout),
            None => defaults.approval_warning.min(config.policy.approval_timeout / 10),
        };
        if config.policy.max_events < 16 {
            return Err(ConfigError { name: "AGENT_RUNS_MAX_EVENTS_PER_RUN", problem: "must be at least 16".into() });
        }
        if config.policy.lease < Duration::from_millis(300) {
            return Err(ConfigError { name: "AGENT_RUNS_LEASE_MS", problem: "must be at least 300".into() });
        }
        if config.worker_deadline_margin < Duration::from_millis(MIN_WORKER_DEADLINE_MARGIN_MS) {
            return Err(ConfigError {
                name: "AGENT_RUNS_WORKER_DEADLINE_MARGIN_MS",
                problem: format!(
                    "must be at least {MIN_WORKER_DEADLINE_MARGIN_MS}: a tool call in flight at the stop is let finish, and may take {MAX_TOOL_TIMEOUT_MS} ms"
                ),
            });
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(86_400)).contains(&config.limits.holds.stream_lifetime) {
            return Err(ConfigError { name: "AGENT_RUNS_STREAM_MAX_SECS", problem: "must be 1 to 86400".into() });
        }
        if config.limits.holds.per_owner == 0 {
            return Err(ConfigError {
                name: "AGENT_RUNS_MAX_HELD_PER_OWNER",
                problem: "must be at least 1 (0 would refuse every stream and waiting poll)".into(),
            });
        }
        if config.policy.max_attempts == 0 {
            return Err(ConfigError { name: "AGENT_RUNS_MAX_ATTEMPTS", problem: "must be at least 1".into() });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let config = Config::from_lookup(|_| None).unwrap();
        assert_eq!(config.default_agent, "echo");
        assert_eq!(config.policy, ExecutionPolicy::default());
        let config = Config::from_lookup(|name| (name == "AGENT_RUNS_LEASE_MS").then(|| "2000".into())).unwrap();
        assert_eq!(config.policy.lease, Duration::from_secs(2));
        assert!(Config::from_lookup(|name| (name == "AGENT_RUNS_MAX_ATTEMPTS").then(|| "x".into())).is_err());
        let margin = |value: &str| {
            let value = value.to_owned();
            Config::from_lookup(move |name| (name == "AGENT_RUNS_WORKER_DEADLINE_MARGIN_MS").then(|| value.clone()))
        };
        assert!(margin("10000").is_err(), "shorter than a tool call may take");
        assert_eq!(margin("200000").unwrap().worker_deadline_margin, Duration::from_secs(200));
        let one = |name: &'static str, value: &'static str| {
            Config::from_lookup(move |asked| (asked == name).then(|| value.into()))
        };
        assert!(one("AGENT_RUNS_MAX_HELD_PER_OWNER", "0").is_err());
        assert_eq!(config.event_format, EventFormat::Record);
        assert_eq!(one("AGENT_RUNS_EVENT_FORMAT", "1").unwrap().event_format, EventFormat::Rendered);
        assert!(one("AGENT_RUNS_EVENT_FORMAT", "3").is_err());
        assert!(one("AGENT_RUNS_STREAM_MAX_SECS", "0").is_err());
        assert!(one("AGENT_RUNS_STREAM_MAX_SECS", "18446744073709551615").is_err(), "a lifetime past any clock");
        assert_eq!(one("AGENT_RUNS_MAX_WAIT_SECS", "60").unwrap().limits.holds.max_wait, Duration::from_secs(20));
    }

    #[test]
    fn traces_are_exported_when_an_otlp_endpoint_is_set_and_not_switched_off() {
        let traces = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            Config::from_lookup(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
                .map(|config| config.traces)
        };
        let off = traces(&[]).unwrap();
        assert_eq!((off.export, off.service_name.as_str()), (false, "agent-runs"));
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318");
        assert!(traces(&[endpoint]).unwrap().export);
        assert!(traces(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")]).unwrap().export);
        assert!(!traces(&[endpoint, ("OTEL_SDK_DISABLED", "true")]).unwrap().export);
        assert!(!traces(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]).unwrap().export);
        assert!(!traces(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).unwrap().export);
        let named = traces(&[endpoint, ("OTEL_SERVICE_NAME", "runs-eu"), ("AWS_LAMBDA_FUNCTION_NAME", "create")]);
        let named = named.unwrap();
        assert_eq!((named.service_name.as_str(), named.function_name.as_deref()), ("runs-eu", Some("create")));
        let grpc = traces(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(grpc.to_string().contains("http/protobuf"), "{grpc}");
        assert!(traces(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).unwrap().export);
        assert!(!traces(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap().export, "no endpoint, nothing to refuse");
        assert_eq!(off.timeout, Duration::from_secs(10));
        assert_eq!(
            traces(&[endpoint, ("OTEL_EXPORTER_OTLP_TIMEOUT", "500")]).unwrap().timeout,
            Duration::from_millis(500)
        );
        assert_eq!(off.sampler, Sampler { ratio: 1.0, parent_based: true });
        let ratio = traces(&[endpoint, ("OTEL_TRACES_SAMPLER", "traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", "0.25")]);
        assert_eq!(ratio.unwrap().sampler, Sampler { ratio: 0.25, parent_based: false });
        assert!(traces(&[endpoint, ("OTEL_TRACES_SAMPLER", "xray")]).is_err());
        assert!(traces(&[endpoint, ("OTEL_TRACES_SAMPLER_ARG", "2")]).is_err());
        assert!(
            traces(&[("OTEL_TRACES_SAMPLER", "xray")]).is_ok(),
            "settings for traces elsewhere, not exporting here"
        );
    }
}
