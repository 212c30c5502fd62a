//! `agent-runs aws-setup`: creates the DynamoDB table, the SQS queues and
//! the receipt signing key (KMS) exactly as template.yaml defines them, on whatever endpoint the AWS
//! environment names (the local emulator in tests and development).

use std::path::PathBuf;

use agent_runs_aws::DynamoStore;
use agent_runs_aws::setup::{create_queues, create_signing_key, create_table, read_template};
use agent_runs_platform::aws_sdk::sdk_config;
use clap::Args;

use crate::keys::Error;

#[derive(Args)]
pub struct AwsSetupArgs {
    /// The SAM template whose table and queues to create.
    #[arg(long, default_value = "template.yaml")]
    template: PathBuf,
    /// Names are `<prefix>-runs` (table and queue), `<prefix>-dlq`,
    /// `<prefix>-webhooks` and `<prefix>-webhook-dlq`.
    #[arg(long, default_value = "agent-runs")]
    prefix: String,
}

pub async fn run(args: AwsSetupArgs) -> Result<(), Error> {
    let template = read_template(&args.template).map_err(|error| error as Error)?;
    let sdk = sdk_config().await;
    let table = format!("{}-runs", args.prefix);
    create_table(&aws_sdk_dynamodb::Client::new(&sdk), &template, &table).await.map_err(|error| error as Error)?;
    let queues = create_queues(&aws_sdk_sqs::Client::new(&sdk), &template, &args.prefix)
        .await
        .map_err(|error| error as Error)?;
    println!("export AGENT_RUNS_TABLE={table}");
    println!("export AGENT_RUNS_QUEUE_URL={}", queues.runs);
    println!("export AGENT_RUNS_DLQ_URL={}", queues.runs_dead_letters);
    println!("export AGENT_RUNS_WEBHOOK_QUEUE_URL={}", queues.webhook_deliveries);
    println!("export AGENT_RUNS_WEBHOOK_DLQ_URL={}", queues.webhook_dead_letters);
    let key = create_signing_key(&aws_sdk_kms::Client::new(&sdk), &template).await.map_err(|error| error as Error)?;
    println!("export AGENT_RUNS_RECEIPT_KEY_ID={key}");
    Ok(())
}

#[derive(Args)]
pub struct AwsMigrateArgs {
    /// The table to move to the current layout (docs/operations.md: stop
    /// the stack's functions first; set AGENT_RUNS_MAX_ACTIVE_RUNS as the
    /// stack does, if it is not the default).
    #[arg(long)]
    table: String,
}

/// `agent-runs aws-migrate`: moves a table written before the sharded
/// layout to it, puts decisions made before the history index into it,
/// and says what it did.
pub async fn migrate(args: AwsMigrateArgs) -> Result<(), Error> {
    // The stack's limit (AGENT_RUNS_MAX_ACTIVE_RUNS) lays out the count.
    let limit = agent_runs_service::config::Config::from_env()?.limits.max_active_runs;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&sdk_config().await), args.table);
    // An operator's tool: the whole cause (a missing table, no permission).
    let migrated = store.migrate_layout(limit).await.map_err(|error| agent_runs_ports::error_chain(&error))?;
    println!(
        "moved {} runs and {} idempotency records, replaced {} active-run counts, listed {} API keys under their owner; {} items changed while moving",
        migrated.runs, migrated.idempotency_records, migrated.counters, migrated.keys, migrated.skipped
    );
    if migrated.skipped > 0 {
        return Err("some items changed while being moved: run aws-migrate again".into());
    }
    let indexed = store.index_decisions().await.map_err(|error| agent_runs_ports::error_chain(&error))?;
    println!("indexed {indexed} decisions people made for policy tests");
    Ok(())
}
