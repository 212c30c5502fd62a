//! Faults at the AWS SDK: errors answered in place of DynamoDB's and SQS's,
//! and a model of DynamoDB's capacity (throttling, transaction conflicts)
//! that moto does not show.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{Fault, FaultPlan};

/// The error an [`AwsErrorInterceptor`] answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwsError {
    /// `400 ThrottlingException`, which the SDK retries with backoff.
    Throttling,
    /// `500 InternalServerError`.
    ServerError,
    /// `400 TransactionCanceledException` with the reasons
    /// `[TransactionConflict, None]`, for `TransactWriteItems` calls only. As
    /// when another transaction held an item, the call has no effect: the
    /// service receives an empty request in its place.
    TransactionConflict,
    /// `400 TransactionConflictException`, for `PutItem` calls only: a
    /// single write to an item a transaction holds. The call has no effect.
    WriteConflict,
    /// `500 InternalServerError` for a call that never arrived (a dropped
    /// connection, a crash before the send): the call has no effect.
    NotDelivered,
}

impl AwsError {
    fn response(self) -> (u16, String) {
        match self {
            AwsError::Throttling => dynamodb_error(400, "ThrottlingException", ""),
            AwsError::ServerError | AwsError::NotDelivered => dynamodb_error(500, "InternalServerError", ""),
            // As when another transaction held the first of two items.
            AwsError::TransactionConflict => canceled(2, "TransactionConflict", |position| position == 0),
            AwsError::WriteConflict => dynamodb_error(400, "TransactionConflictException", ""),
        }
    }
}

/// The responses the interceptors give an attempt in place of the
/// service's (each sets its own at every attempt).
#[derive(Debug, Clone, Default)]
struct Answers {
    error: Option<(u16, String)>,
    capacity: Option<(u16, String)>,
}

impl aws_smithy_types::config_bag::Storable for Answers {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

fn set_answer(cfg: &mut aws_smithy_types::config_bag::ConfigBag, set: impl FnOnce(&mut Answers)) {
    let mut answers = cfg.load::<Answers>().cloned().unwrap_or_default();
    set(&mut answers);
    cfg.interceptor_state().store_put(answers);
}

/// The DynamoDB operation an attempt calls, from its `x-amz-target`.
fn dynamodb_operation(
    context: &aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
) -> &'static str {
    let target = context.request().headers().get("x-amz-target").unwrap_or_default();
    match target.rsplit('.').next() {
        Some("GetItem") => "GetItem",
        Some("PutItem") => "PutItem",
        Some("UpdateItem") => "UpdateItem",
        Some("DeleteItem") => "DeleteItem",
        Some("Query") => "Query",
        Some("BatchGetItem") => "BatchGetItem",
        Some("TransactWriteItems") => "TransactWriteItems",
        _ => "other",
    }
}

/// Sends the service an empty request in place of this one, so the call
/// has no effect (the answer is replaced anyway).
fn empty_request(
    context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
) {
    let request = context.request_mut();
    *request.body_mut() = aws_smithy_types::body::SdkBody::from("{}");
    request.headers_mut().insert("content-length", "2");
}

/// Replaces the response of an attempt that an interceptor answers.
fn answer_instead(
    context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut<'_>,
    cfg: &aws_smithy_types::config_bag::ConfigBag,
) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
    let Some(answers) = cfg.load::<Answers>() else {
        return Ok(());
    };
    let Some((status, body)) = answers.capacity.clone().or_else(|| answers.error.clone()) else {
        return Ok(());
    };
    let mut response = aws_smithy_runtime_api::http::Response::new(
        aws_smithy_runtime_api::http::StatusCode::try_from(status)?,
        aws_smithy_types::body::SdkBody::from(body),
    );
    response.headers_mut().insert("content-type", "application/x-amz-json-1.0");
    *context.response_mut() = response;
    Ok(())
}

/// An SDK interceptor for DynamoDB clients that answers the calls its plan
/// picks with an error in place of the service's response, so the SDK's
/// retries and the store's error mapping are exercised. A throttled call or
/// a server error still reached the service (and may have taken effect); a
/// conflict did not.
#[derive(Clone)]
pub struct AwsErrorInterceptor {
    plan: Arc<dyn FaultPlan>,
    error: AwsError,
}

impl std::fmt::Debug for AwsErrorInterceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsErrorInterceptor").field("error", &self.error).finish()
    }
}

impl AwsErrorInterceptor {
    pub fn new(plan: Arc<dyn FaultPlan>, error: AwsError) -> Self {
        AwsErrorInterceptor { plan, error }
    }
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for AwsErrorInterceptor {
    fn name(&self) -> &'static str {
        "AwsErrorInterceptor"
    }

    /// Asks the plan about each attempt (with the operation's name), and
    /// empties the request of a transaction it answers as a conflict.
    fn modify_before_transmit(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let operation = dynamodb_operation(context);
        let applies = match self.error {
            AwsError::TransactionConflict => operation == "TransactWriteItems",
            AwsError::WriteConflict => operation == "PutItem",
            AwsError::Throttling | AwsError::ServerError | AwsError::NotDelivered => true,
        };
        let picked = applies && self.plan.next(operation) != Fault::None;
        let answer = picked.then(|| self.error.response());
        set_answer(cfg, |answers| answers.error = answer);
        if picked
            && matches!(self.error, AwsError::TransactionConflict | AwsError::WriteConflict | AwsError::NotDelivered)
        {
            empty_request(context);
        }
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut<
            '_,
        >,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        answer_instead(context, cfg)
    }
}

/// Write rates DynamoDB allows, in write units per second (a transactional
/// write costs 2, as it costs twice the write capacity), scaled down so one
/// machine can reach them.
#[derive(Debug, Clone, Copy)]
pub struct CapacityLimits {
    /// Per item (DynamoDB: 1,000 WCU/s).
    pub item: f64,
    /// Per partition key value, of the table or of an index (DynamoDB: 1,000
    /// WCU/s for a partition, which a hot key cannot be split out of when
    /// its sort keys only grow).
    pub partition: f64,
}

/// What a [`CapacityModel`] turned away.
#[derive(Debug, Default)]
pub struct CapacityCounts {
    pub throttled: AtomicUsize,
    pub conflicts: AtomicUsize,
}

/// One item a write touches.
struct Touched {
    item: String,
    /// The partitions its units count against: the table's and, for a put,
    /// those of the indexes it is in.
    partitions: Vec<String>,
}

#[derive(Default)]
struct CapacityState {
    /// Unused units and when they were last topped up, per item and per partition.
    buckets: HashMap<String, (f64, std::time::Instant)>,
    /// Items of transactions under way, with how many hold each.
    held: HashMap<String, usize>,
}

/// The items an attempt's transaction holds until its answer arrives.
#[derive(Debug, Clone)]
struct Held(Vec<String>);

impl aws_smithy_types::config_bag::Storable for Held {
    type Storer = aws_smithy_types::config_bag::StoreReplace<Self>;
}

/// What moto does not model of DynamoDB: an SDK interceptor that throttles
/// writes over an item's or a partition's rate (token buckets holding a
/// second's worth), and cancels a transaction, or fails a single write, that
/// touches an item another transaction under way holds
/// (`TransactionConflict`). Turned-away calls do not reach the service.
#[derive(Clone)]
pub struct CapacityModel {
    limits: CapacityLimits,
    state: Arc<Mutex<CapacityState>>,
    pub counts: Arc<CapacityCounts>,
}

impl std::fmt::Debug for CapacityModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityModel").field("limits", &self.limits).finish()
    }
}

/// A DynamoDB error response of this status and kind, with `extra` fields.
fn dynamodb_error(status: u16, kind: &str, extra: &str) -> (u16, String) {
    let message = "injected by a test";
    (status, format!(r#"{{"__type":"com.amazonaws.dynamodb.v20120810#{kind}","message":"{message}"{extra}}}"#))
}

/// The items a write request touches (`pk`/`sk` keys), and the partitions of
/// the indexes that a put writes (attributes named `gsi<n>pk`).
fn touched_items(operation: &str, body: &serde_json::Value) -> Vec<Touched> {
    let text = |value: &serde_json::Value| value.get("S").and_then(|text| text.as_str()).unwrap_or_default().to_owned();
    let touched = |item: &serde_json::Value| {
        let pk = text(&item["pk"]);
        let mut partitions = vec![format!("table:{pk}")];
        if let Some(attributes) = item.as_object() {
            for (name, value) in attributes {
                if name.starts_with("gsi") && name.ends_with("pk") {
                    partitions.push(format!("{}:{}", name.trim_end_matches("pk"), text(value)));
                }
            }
        }
        Touched { item: format!("{pk}\u{0}{}", text(&item["sk"])), partitions }
    };
    let keyed = |write: &serde_json::Value| {
        let key = &write["Key"];
        Touched {
            item: format!("{}\u{0}{}", text(&key["pk"]), text(&key["sk"])),
            partitions: vec![format!("table:{}", text(&key["pk"]))],
        }
    };
    match operation {
        "PutItem" => vec![touched(&body["Item"])],
        "UpdateItem" | "DeleteItem" => vec![keyed(body)],
        "TransactWriteItems" => body["TransactItems"]
            .as_array()
            .map(|writes| {
                writes
                    .iter()
                    .map(|write| {
                        match (
                            write.get("Put"),
                            write.get("Update").or(write.get("Delete")).or(write.get("ConditionCheck")),
                        ) {
                            (Some(put), _) => touched(&put["Item"]),
                            (None, Some(other)) => keyed(other),
                            (None, None) => Touched { item: String::new(), partitions: Vec::new() },
                        }
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

impl CapacityModel {
    pub fn new(limits: CapacityLimits) -> Self {
        CapacityModel { limits, state: Arc::default(), counts: Arc::default() }
    }

    /// Admits a write of `touched` items (each costing `units`), or says
    /// why not: the positions held by another transaction, or throttled.
    fn admit(&self, touched: &[Touched], units: f64, transaction: bool) -> Result<(), Refusal> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let held: Vec<bool> = touched.iter().map(|write| state.held.contains_key(&write.item)).collect();
        if held.contains(&true) {
            return Err(Refusal::Conflict(held));
        }
        let now = std::time::Instant::now();
        let mut wanted: HashMap<String, (f64, f64, usize)> = HashMap::new();
        for (position, write) in touched.iter().enumerate() {
            let item = wanted.entry(format!("item:{}", write.item)).or_insert((0.0, self.limits.item, position));
            item.0 += units;
            for partition in &write.partitions {
                wanted.entry(partition.clone()).or_insert((0.0, self.limits.partition, position)).0 += units;
            }
        }
        let mut throttled = None;
        for (bucket, (units, rate, position)) in &wanted {
            let (tokens, at) = state.buckets.entry(bucket.clone()).or_insert((*rate, now));
            *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * rate).min(*rate);
            *at = now;
            if *tokens < *units {
                throttled = Some(*position);
            }
        }
        if let Some(position) = throttled {
            return Err(Refusal::Throttled(position));
        }
        for (bucket, (units, _, _)) in &wanted {
            if let Some((tokens, _)) = state.buckets.get_mut(bucket) {
                *tokens -= units;
            }
        }
        if state.buckets.len() > 200_000 {
            // Full buckets are as good as none.
            let limits = self.limits;
            state.buckets.retain(|_, (tokens, _)| *tokens < limits.item.min(limits.partition));
        }
        if transaction {
            for write in touched {
                *state.held.entry(write.item.clone()).or_default() += 1;
            }
        }
        Ok(())
    }

    fn release(&self, items: &[String]) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for item in items {
            if let Some(count) = state.held.get_mut(item) {
                *count -= 1;
                if *count == 0 {
                    state.held.remove(item);
                }
            }
        }
    }
}

enum Refusal {
    /// `true` at the positions another transaction holds.
    Conflict(Vec<bool>),
    /// The position of a write over its item's or partition's rate.
    Throttled(usize),
}

/// A `TransactionCanceledException` with `code` at `positions` (of `count`).
fn canceled(count: usize, code: &str, at: impl Fn(usize) -> bool) -> (u16, String) {
    let reasons: Vec<String> = (0..count)
        .map(|position| if at(position) { format!(r#"{{"Code":"{code}"}}"#) } else { r#"{"Code":"None"}"#.to_owned() })
        .collect();
    dynamodb_error(400, "TransactionCanceledException", &format!(r#","CancellationReasons":[{}]"#, reasons.join(",")))
}

impl aws_smithy_runtime_api::client::interceptors::Intercept for CapacityModel {
    fn name(&self) -> &'static str {
        "CapacityModel"
    }

    fn modify_before_transmit(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextMut<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        let operation = dynamodb_operation(context);
        let body: serde_json::Value =
            context.request().body().bytes().and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or_default();
        let touched = touched_items(operation, &body);
        let transaction = operation == "TransactWriteItems";
        let answer = if touched.is_empty() {
            None
        } else {
            match self.admit(&touched, if transaction { 2.0 } else { 1.0 }, transaction) {
                Ok(()) => {
                    if transaction {
                        cfg.interceptor_state().store_put(Held(touched.into_iter().map(|write| write.item).collect()));
                    }
                    None
                }
                Err(Refusal::Conflict(held)) => {
                    self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
                    Some(if transaction {
                        canceled(held.len(), "TransactionConflict", |position| held[position])
                    } else {
                        dynamodb_error(400, "TransactionConflictException", "")
                    })
                }
                Err(Refusal::Throttled(position)) => {
                    self.counts.throttled.fetch_add(1, Ordering::Relaxed);
                    Some(if transaction {
                        canceled(touched.len(), "ThrottlingError", |at| at == position)
                    } else {
                        dynamodb_error(400, "ProvisionedThroughputExceededException", "")
                    })
                }
            }
        };
        if answer.is_some() {
            empty_request(context);
        }
        set_answer(cfg, |answers| answers.capacity = answer);
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut aws_smithy_runtime_api::client::interceptors::context::BeforeDeserializationInterceptorContextMut<
            '_,
        >,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        answer_instead(context, cfg)
    }

    /// A transaction holds its items until its answer arrives (or the
    /// attempt fails).
    fn read_after_attempt(
        &self,
        _context: &aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef<'_>,
        _runtime_components: &aws_smithy_runtime_api::client::runtime_components::RuntimeComponents,
        cfg: &mut aws_smithy_types::config_bag::ConfigBag,
    ) -> Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        if let Some(Held(items)) = cfg.load::<Held>().cloned() {
            self.release(&items);
            cfg.interceptor_state().store_put(Held(Vec::new()));
        }
        Ok(())
    }
}
