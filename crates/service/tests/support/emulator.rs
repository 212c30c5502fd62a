//! The AWS API emulator for the store adapters' tests: whether it is there,
//! an SDK configuration for it, and a fresh table made from template.yaml.

/// `true`, after a line saying how to run it, when the emulator is not
/// there: the calling test then returns at once. `bash infra/test.sh`
/// starts the emulator and runs every test.
pub fn without_emulator(test: &str) -> bool {
    if std::env::var_os("AGENT_RUNS_TEST_AWS_ENDPOINT").is_some() {
        return false;
    }
    eprintln!("skipped {test}: it needs the AWS API emulator; `bash infra/test.sh` starts one and runs every test");
    true
}

pub async fn sdk_config() -> aws_config::SdkConfig {
    let endpoint = std::env::var("AGENT_RUNS_TEST_AWS_ENDPOINT").expect("the emulator's endpoint");
    let credentials = aws_sdk_dynamodb::config::Credentials::new("testing", "testing", None, None, "tests");
    agent_runs_platform::aws_sdk::sdk_config_loader()
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(credentials)
        .load()
        .await
}

/// A table of its own, exactly as template.yaml defines it; its name.
pub async fn create_table(sdk: &aws_config::SdkConfig) -> String {
    use agent_runs_aws::setup::{create_table, read_template};
    let template = read_template(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml")))
        .expect("template.yaml");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let name = format!("s{}-{}-runs", std::process::id(), nanos % 1_000_000_000);
    create_table(&aws_sdk_dynamodb::Client::new(sdk), &template, &name).await.expect("create the table");
    name
}
