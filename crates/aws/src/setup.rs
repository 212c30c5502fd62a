//! The DynamoDB table and the SQS queues exactly as `template.yaml`
//! defines them, created on whatever endpoint the SDK configuration names:
//! the AWS API emulator in tests and development (`agent-runs aws-setup`).
//! Not part of the service: compiled only with the `aws-setup` feature.

use std::path::Path;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType, StreamSpecification, StreamViewType, TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
pub use serde_yaml::Value;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A resource of the template by logical id, its `Properties`.
fn properties<'a>(template: &'a Value, logical_id: &str) -> Result<&'a Value, Error> {
    template["Resources"][logical_id]
        .get("Properties")
        .ok_or_else(|| format!("template.yaml has no resource {logical_id} with Properties").into())
}

fn text(value: &Value, what: &str) -> Result<String, Error> {
    value.as_str().map(str::to_owned).ok_or_else(|| format!("template.yaml: {what} is not a string").into())
}

fn number(value: &Value, what: &str) -> Result<String, Error> {
    value.as_u64().map(|n| n.to_string()).ok_or_else(|| format!("template.yaml: {what} is not a number").into())
}

fn key_schema(value: &Value) -> Result<Vec<KeySchemaElement>, Error> {
    value
        .as_sequence()
        .ok_or("template.yaml: KeySchema is not a list")?
        .iter()
        .map(|element| {
            Ok(KeySchemaElement::builder()
                .attribute_name(text(&element["AttributeName"], "AttributeName")?)
                .key_type(KeyType::from(text(&element["KeyType"], "KeyType")?.as_str()))
                .build()?)
        })
        .collect()
}

pub async fn create_table(client: &aws_sdk_dynamodb::Client, template: &Value, table_name: &str) -> Result<(), Error> {
    let table = properties(template, "RunsTable")?;
    let mut request = client
        .create_table()
        .table_name(table_name)
        .billing_mode(BillingMode::from(text(&table["BillingMode"], "BillingMode")?.as_str()))
        .set_key_schema(Some(key_schema(&table["KeySchema"])?));
    for definition in table["AttributeDefinitions"].as_sequence().ok_or("AttributeDefinitions is not a list")? {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(text(&definition["AttributeName"], "AttributeName")?)
                .attribute_type(ScalarAttributeType::from(
                    text(&definition["AttributeType"], "AttributeType")?.as_str(),
                ))
                .build()?,
        );
    }
    for index in table["GlobalSecondaryIndexes"].as_sequence().into_iter().flatten() {
        let projection = &index["Projection"];
        let non_key: Option<Vec<String>> = projection["NonKeyAttributes"]
            .as_sequence()
            .map(|names| names.iter().filter_map(|name| name.as_str().map(str::to_owned)).collect());
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(text(&index["IndexName"], "IndexName")?)
                .set_key_schema(Some(key_schema(&index["KeySchema"])?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(
                            text(&projection["ProjectionType"], "ProjectionType")?.as_str(),
                        ))
                        .set_non_key_attributes(non_key)
                        .build(),
                )
                .build()?,
        );
    }
    if let Some(stream) = table.get("StreamSpecification") {
        request = request.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::from(text(&stream["StreamViewType"], "StreamViewType")?.as_str()))
                .build()?,
        );
    }
    request.send().await?;
    if let Some(ttl) = table.get("TimeToLiveSpecification") {
        client
            .update_time_to_live()
            .table_name(table_name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(text(&ttl["AttributeName"], "TTL AttributeName")?)
                    .enabled(ttl["Enabled"].as_bool().unwrap_or(false))
                    .build()?,
            )
            .send()
            .await?;
    }
    Ok(())
}

/// The queues of template.yaml, by URL.
#[derive(Debug, Clone)]
pub struct Queues {
    pub runs: String,
    pub runs_dead_letters: String,
    pub webhook_deliveries: String,
    pub webhook_dead_letters: String,
}

async fn create_queue(
    client: &aws_sdk_sqs::Client,
    properties: &Value,
    name: String,
    redrive_to: Option<&str>,
) -> Result<String, Error> {
    let mut request = client
        .create_queue()
        .queue_name(name)
        .attributes(
            QueueAttributeName::VisibilityTimeout,
            number(&properties["VisibilityTimeout"], "VisibilityTimeout")?,
        )
        .attributes(
            QueueAttributeName::MessageRetentionPeriod,
            number(&properties["MessageRetentionPeriod"], "MessageRetentionPeriod")?,
        );
    if let Some(dead_letters) = redrive_to {
        let arn = client
            .get_queue_attributes()
            .queue_url(dead_letters)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await?
            .attributes
            .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
            .ok_or("no dead-letter queue ARN")?;
        let max_receives =
            properties["RedrivePolicy"]["maxReceiveCount"].as_u64().ok_or("maxReceiveCount is not a number")?;
        let redrive = serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": max_receives});
        request = request.attributes(QueueAttributeName::RedrivePolicy, redrive.to_string());
    }
    Ok(request.send().await?.queue_url.ok_or("no queue url")?)
}

/// Creates each dead-letter queue, then the queue redriving to it.
pub async fn create_queues(client: &aws_sdk_sqs::Client, template: &Value, prefix: &str) -> Result<Queues, Error> {
    let runs_dead_letters =
        create_queue(client, properties(template, "DeadLetterQueue")?, format!("{prefix}-dlq"), None).await?;
    let runs =
        create_queue(client, properties(template, "RunQueue")?, format!("{prefix}-runs"), Some(&runs_dead_letters))
            .await?;
    let webhook_dead_letters =
        create_queue(client, properties(template, "WebhookDeadLetterQueue")?, format!("{prefix}-webhook-dlq"), None)
            .await?;
    let webhook_deliveries = create_queue(
        client,
        properties(template, "WebhookDeliveryQueue")?,
        format!("{prefix}-webhooks"),
        Some(&webhook_dead_letters),
    )
    .await?;
    Ok(Queues { runs, runs_dead_letters, webhook_deliveries, webhook_dead_letters })
}

/// The receipt signing key as template.yaml's `ReceiptSigningKey` has
/// it (key spec and usage): its id.
pub async fn create_signing_key(client: &aws_sdk_kms::Client, template: &Value) -> Result<String, Error> {
    let properties = properties(template, "ReceiptSigningKey")?;
    let spec = text(&properties["KeySpec"], "ReceiptSigningKey.KeySpec")?;
    let usage = text(&properties["KeyUsage"], "ReceiptSigningKey.KeyUsage")?;
    let created = client
        .create_key()
        .key_spec(aws_sdk_kms::types::KeySpec::from(spec.as_str()))
        .key_usage(aws_sdk_kms::types::KeyUsageType::from(usage.as_str()))
        .description(text(&properties["Description"], "ReceiptSigningKey.Description")?)
        .send()
        .await?;
    Ok(created.key_metadata.ok_or("no key metadata")?.key_id)
}

pub fn read_template(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    Ok(serde_yaml::from_str(&text)?)
}
