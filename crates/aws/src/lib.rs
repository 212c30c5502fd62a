//! The AWS adapters of Agent Runs: the store ports on DynamoDB, the work
//! and delivery queues on SQS, and receipts signed by a KMS key. Only the
//! Lambda functions and the CLI's AWS commands link them.

mod dynamodb;
pub mod kms;
#[cfg(feature = "setup")]
pub mod setup;
mod sqs;
mod webhook_sqs;

pub use dynamodb::{
    ABANDONED_CREATE, APPROVALS_INDEX, DECISIONS_INDEX, DUE_INDEX, DUE_SHARDS, DynamoStore, INLINE_CHECKPOINT_BYTES,
    Migrated, NOTIFIED_EVENT_PREFIX, OWNER_SHARDS, RECOUNT_EVERY, STATUS_INDEX, decode_stream_event,
};
pub use kms::KmsKey;
pub use sqs::SqsQueue;
pub use webhook_sqs::{DeliveryMessage, WebhookQueue};
