//! Lambda events as AWS sends them, from the fixtures.

use aws_lambda_events::event::sqs::SqsEvent;
use serde_json::{Value, json};

/// An SQS event of these message bodies, the `i`-th with the message id
/// `message-<i>`.
pub fn sqs_event(bodies: Vec<String>) -> SqsEvent {
    let fixture: Value = serde_json::from_str(include_str!("../fixtures/sqs-event.json")).unwrap();
    let records: Vec<Value> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| {
            let mut record = fixture["Records"][0].clone();
            record["messageId"] = format!("message-{i}").into();
            record["body"] = body.into();
            record
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).unwrap()
}
