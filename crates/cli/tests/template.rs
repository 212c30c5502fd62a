//! template.yaml is the one source of truth for the AWS resources: the
//! emulator's table and queues (made by `agent-runs aws-setup` from the
//! template) must match it, and the template must keep the rules an
//! operator relies on.

#[path = "../src/template.rs"]
mod generated;
mod support;

use std::collections::{BTreeMap, BTreeSet};

use agent_runs_service::api::ROUTES;
use agent_runs_service::api::routes::FALLBACK_FUNCTION;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_yaml::Value;

fn template() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

fn strings(value: &Value, field: &str) -> BTreeSet<(String, String)> {
    value
        .as_sequence()
        .unwrap()
        .iter()
        .map(|entry| {
            let name = entry["AttributeName"].as_str().unwrap().to_owned();
            (name, entry[field].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_resources_match_the_template() {
    if support::without_emulator("the_emulator_resources_match_the_template") {
        return;
    }
    let template = template();
    let resources: BTreeMap<String, String> = support::create_aws_resources().into_iter().collect();
    let sdk = support::aws_sdk_config().await;

    let table_spec = &template["Resources"]["RunsTable"]["Properties"];
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    let table =
        dynamodb.describe_table().table_name(&resources["AGENT_RUNS_TABLE"]).send().await.unwrap().table.unwrap();
    let key_schema: BTreeSet<(String, String)> =
        table.key_schema().iter().map(|k| (k.attribute_name().to_owned(), k.key_type().as_str().to_owned())).collect();
    assert_eq!(key_schema, strings(&table_spec["KeySchema"], "KeyType"));
    let attributes: BTreeSet<(String, String)> = table
        .attribute_definitions()
        .iter()
        .map(|a| (a.attribute_name().to_owned(), a.attribute_type().as_str().to_owned()))
        .collect();
    assert_eq!(attributes, strings(&table_spec["AttributeDefinitions"], "AttributeType"));
    let indexes: BTreeMap<String, (BTreeSet<(String, String)>, String)> = table
        .global_secondary_indexes()
        .iter()
        .map(|index| {
            let keys =
                index.key_schema().iter().map(|k| (k.attribute_name().to_owned(), k.key_type().as_str().to_owned()));
            let projection = index.projection().unwrap().projection_type().unwrap().as_str().to_owned();
            (index.index_name().unwrap().to_owned(), (keys.collect(), projection))
        })
        .collect();
    let expected: BTreeMap<String, (BTreeSet<(String, String)>, String)> = table_spec["GlobalSecondaryIndexes"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|index| {
            let projection = index["Projection"]["ProjectionType"].as_str().unwrap().to_owned();
            (index["IndexName"].as_str().unwrap().to_owned(), (strings(&index["KeySchema"], "KeyType"), projection))
        })
        .collect();
    assert_eq!(indexes, expected);
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        [
            agent_runs_aws::STATUS_INDEX,
            agent_runs_aws::DUE_INDEX,
            agent_runs_aws::APPROVALS_INDEX,
            agent_runs_aws::DECISIONS_INDEX
        ]
    );
    let ttl = dynamodb
        .describe_time_to_live()
        .table_name(&resources["AGENT_RUNS_TABLE"])
        .send()
        .await
        .unwrap()
        .time_to_live_description
        .unwrap();
    assert_eq!(ttl.attribute_name(), table_spec["TimeToLiveSpecification"]["AttributeName"].as_str());

    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let attributes = |url: String| {
        let sqs = sqs.clone();
        async move {
            sqs.get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::All)
                .send()
                .await
                .unwrap()
                .attributes
                .unwrap()
        }
    };
    let queue = attributes(resources["AGENT_RUNS_QUEUE_URL"].clone()).await;
    let dlq = attributes(resources["AGENT_RUNS_DLQ_URL"].clone()).await;
    let queue_spec = &template["Resources"]["RunQueue"]["Properties"];
    assert_eq!(
        queue[&QueueAttributeName::VisibilityTimeout],
        queue_spec["VisibilityTimeout"].as_u64().unwrap().to_string()
    );
    assert_eq!(
        queue[&QueueAttributeName::MessageRetentionPeriod],
        queue_spec["MessageRetentionPeriod"].as_u64().unwrap().to_string()
    );
    let redrive: serde_json::Value = serde_json::from_str(&queue[&QueueAttributeName::RedrivePolicy]).unwrap();
    assert_eq!(redrive["deadLetterTargetArn"], dlq[&QueueAttributeName::QueueArn].as_str());
    assert_eq!(
        redrive["maxReceiveCount"].to_string().trim_matches('"'),
        queue_spec["RedrivePolicy"]["maxReceiveCount"].as_u64().unwrap().to_string()
    );
}

fn functions(template: &Value) -> Vec<(&str, &Value)> {
    template["Resources"]
        .as_mapping()
        .unwrap()
        .iter()
        .filter(|(_, resource)| resource["Type"] == "AWS::Serverless::Function")
        .map(|(name, resource)| (name.as_str().unwrap(), resource))
        .collect()
}

#[test]
fn every_function_is_a_workspace_binary_built_with_cargo_lambda() {
    let template = template();
    let globals = &template["Globals"]["Function"];
    assert_eq!(globals["Runtime"], "provided.al2023");
    assert_eq!(globals["Architectures"][0], "arm64");
    assert_eq!(globals["Handler"], "bootstrap");
    assert_eq!(globals["Tracing"], "Active");
    assert_eq!(globals["LoggingConfig"]["LogFormat"], "JSON");
    let mut binaries = BTreeSet::new();
    for (name, function) in functions(&template) {
        assert_eq!(function["Metadata"]["BuildMethod"], "rust-cargolambda", "{name}");
        assert_eq!(function["Properties"]["CodeUri"], ".", "{name} builds from the workspace root");
        let binary = function["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap();
        let main = format!("{}/../../functions/{binary}/src/main.rs", env!("CARGO_MANIFEST_DIR"));
        assert!(std::path::Path::new(&main).exists(), "{name}: no functions/{binary}");
        binaries.insert(binary.to_owned());
        let logs = format!("{name}Logs");
        assert!(
            matches!(
                template["Resources"][logs.as_str()]["Properties"]["RetentionInDays"],
                serde_yaml::Value::Tagged(_)
            ),
            "{name} has a log group with retention"
        );
    }
    let expected: BTreeSet<String> = [
        "create",
        "list",
        "get",
        "cancel",
        "decide",
        "decide-batch",
        "extend",
        "events",
        "approvals",
        "fallback",
        "worker",
        "sweeper",
        "dead-letter",
        "webhooks",
        "policies",
        "directory",
        "notifier",
        "deliver",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(binaries, expected);
}

/// A held long-poll is one execution for its whole wait: the events
/// function holds it for less than on the embedded server, within its own
/// reserved executions, so it can never take the concurrency others need.
#[test]
fn the_events_function_holds_long_polls_briefly_within_its_own_reserved_concurrency() {
    let template = template();
    let events = &template["Resources"]["EventsFunction"]["Properties"];
    let max_wait: u64 =
        events["Environment"]["Variables"]["AGENT_RUNS_MAX_WAIT_SECS"].as_str().unwrap().parse().unwrap();
    assert!(max_wait < 20, "held {max_wait} s, as long as the embedded server");
    let timeout = events["Timeout"].as_u64().unwrap();
    assert!(
        timeout > max_wait + 5 && timeout < 30,
        "timeout {timeout} s: the wait and a read, under API Gateway's 30 s"
    );
    let reserved = format!("{:?}", events["ReservedConcurrentExecutions"]);
    assert!(reserved.contains("EventsConcurrency"), "no reserved concurrency: {reserved}");
    let parameter = &template["Parameters"]["EventsConcurrency"];
    assert!(parameter["Default"].as_u64().unwrap() > 0, "reserved by default");
}

/// The functions' part of template.yaml is what `agent-runs template`
/// makes, and every function (a crate of its own) is in it.
#[test]
fn the_functions_of_the_template_are_made_from_the_function_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../template.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let regenerated = generated::regenerate(&text).expect("template.yaml has its generated part");
    assert!(
        regenerated == text,
        "template.yaml's functions are not what crates/cli/src/template.rs makes: \
         run `cargo run -p agent-runs -- template --write template.yaml`"
    );
    let crates: BTreeSet<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../functions"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    let listed: BTreeSet<String> = generated::FUNCTIONS.iter().map(|function| function.name.to_owned()).collect();
    assert_eq!(listed, crates, "functions/<name> crates against the function table");
    for function in &generated::FUNCTIONS {
        let routed = ROUTES.iter().any(|route| route.function == function.name && route.has_gateway_route());
        assert_eq!(
            routed,
            matches!(function.trigger, generated::Trigger::Routes),
            "{}: a function is invoked by its routes exactly when it has some",
            function.name
        );
    }
}

/// The binary a function of the template runs.
fn binary(function: &Value) -> &str {
    function["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap()
}

#[test]
fn every_route_of_the_table_goes_to_its_own_function_and_nothing_else_is_routed() {
    let template = template();
    let mut routes = BTreeMap::new();
    for (_, function) in functions(&template) {
        for (_, event) in function["Properties"]["Events"].as_mapping().into_iter().flatten() {
            if event["Type"] == "HttpApi" {
                let route = format!(
                    "{} {}",
                    event["Properties"]["Method"].as_str().unwrap(),
                    event["Properties"]["Path"].as_str().unwrap()
                );
                assert!(routes.insert(route, binary(function).to_owned()).is_none());
            }
        }
    }
    let mut expected: BTreeMap<String, String> = ROUTES
        .iter()
        .filter(|route| route.has_gateway_route())
        .map(|route| (route.key(), route.function.to_owned()))
        .collect();
    expected.insert("ANY $default".into(), FALLBACK_FUNCTION.into());
    assert_eq!(routes, expected, "template.yaml's HttpApi events against api::routes::ROUTES");
}

#[test]
fn the_cargo_lambda_watch_router_is_the_route_table() {
    let manifest = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml")).unwrap();
    let manifest: toml::Value = toml::from_str(&manifest).unwrap();
    let router = manifest["workspace"]["metadata"]["lambda"]["watch"]["router"].as_table().unwrap();
    let mut routed = BTreeSet::new();
    for (path, targets) in router {
        for target in targets.as_array().unwrap() {
            let method = target["method"].as_str().unwrap();
            routed.insert((format!("{method} {path}"), target["function"].as_str().unwrap().to_owned()));
        }
    }
    let expected: BTreeSet<(String, String)> = ROUTES
        .iter()
        .filter(|route| route.has_gateway_route())
        .map(|route| (route.key(), route.function.to_owned()))
        .collect();
    assert_eq!(routed, expected, "[workspace.metadata.lambda.watch.router] against api::routes::ROUTES");
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml")).unwrap();
    assert!(
        generated::regenerate_router(&text).as_deref() == Some(text.as_str()),
        "the router is not what `cargo run -p agent-runs -- template --write template.yaml` writes"
    );
}

#[test]
fn each_function_crate_serves_its_route() {
    for route in ROUTES.iter().filter(|route| route.has_gateway_route()) {
        let main = format!("{}/../../functions/{}/src/main.rs", env!("CARGO_MANIFEST_DIR"), route.function);
        let source = std::fs::read_to_string(&main).unwrap_or_else(|_| panic!("no functions/{}", route.function));
        let serves = ROUTES
            .iter()
            .filter(|other| other.function == route.function)
            .map(|other| format!("Operation::{:?}", other.operation))
            .find(|serves| source.contains(serves));
        assert!(serves.is_some(), "functions/{} serves an operation of its routes", route.function);
    }
}

#[test]
fn the_queue_outlasts_the_worker_and_failures_go_to_the_dead_letter_queue() {
    let template = template();
    let worker = &template["Resources"]["WorkerFunction"]["Properties"];
    let queue = &template["Resources"]["RunQueue"]["Properties"];
    let timeout = worker["Timeout"].as_u64().unwrap();
    assert!(queue["VisibilityTimeout"].as_u64().unwrap() >= 6 * timeout);
    assert!(queue["RedrivePolicy"]["maxReceiveCount"].as_u64().unwrap() >= 5);
    let dead_letter = &template["Resources"]["DeadLetterFunction"]["Properties"];
    assert!(
        template["Resources"]["DeadLetterQueue"]["Properties"]["VisibilityTimeout"].as_u64().unwrap()
            >= 6 * dead_letter["Timeout"].as_u64().unwrap()
    );
    assert_eq!(
        dead_letter["Events"]["DeadLetters"]["Properties"]["FunctionResponseTypes"][0],
        "ReportBatchItemFailures"
    );
    let event = &worker["Events"]["RunMessages"]["Properties"];
    assert_eq!(event["FunctionResponseTypes"][0], "ReportBatchItemFailures");
    assert!(
        matches!(event["ScalingConfig"]["MaximumConcurrency"], Value::Tagged(_)),
        "maximum concurrency is a parameter"
    );
}

/// The DynamoDB actions a function may take on the table itself (not its
/// indexes).
fn table_actions(function: &Value) -> BTreeSet<String> {
    actions_on(function, "RunsTable.Arn")
}

/// The actions a function may take on `!GetAtt <resource>`.
fn actions_on(function: &Value, resource: &str) -> BTreeSet<String> {
    let on_table = |allowed: &Value| match allowed {
        Value::Tagged(tagged) => tagged.tag == "GetAtt" && tagged.value == resource,
        _ => false,
    };
    let mut actions = BTreeSet::new();
    for policy in function["Properties"]["Policies"].as_sequence().into_iter().flatten() {
        for statement in policy["Statement"].as_sequence().into_iter().flatten() {
            if statement["Effect"] != "Allow" || !on_table(&statement["Resource"]) {
                continue;
            }
            match &statement["Action"] {
                Value::String(action) => {
                    actions.insert(action.clone());
                }
                Value::Sequence(list) => {
                    actions.extend(list.iter().filter_map(|action| action.as_str().map(str::to_owned)))
                }
                _ => {}
            }
        }
    }
    actions
}

/// Every function that writes runs may do every call a run write can make:
/// a terminal write deletes the checkpoint item, and a write whose run's
/// event count fell behind its log queries the run's last event (the
/// emulator does not enforce IAM, so only this test sees a missing one).
#[test]
fn functions_that_write_runs_may_make_every_call_a_run_write_makes() {
    let template = template();
    let writers = ["cancel", "decide", "decide-batch", "extend", "worker", "sweeper", "dead-letter"];
    let needed: BTreeSet<String> =
        ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:Query"]
            .map(str::to_owned)
            .into();
    for (name, function) in functions(&template) {
        if writers.contains(&binary(function)) {
            let allowed = table_actions(function);
            assert!(allowed.is_superset(&needed), "{name} may only {allowed:?}");
        }
    }
}

/// The functions that read several items at once may: a list reads its
/// page's runs, the inbox its entries' runs, a create whose own item of the
/// active-run count is full reads up to 32 others, the sweeper the runs an item
/// of a count holds places for (the emulator does not enforce IAM, so only
/// this test sees a missing permission).
#[test]
fn functions_that_read_items_in_batches_may() {
    let template = template();
    let readers = ["create", "list", "approvals", "sweeper"];
    let mut found = 0;
    for (name, function) in functions(&template) {
        if readers.contains(&binary(function)) {
            found += 1;
            assert!(table_actions(function).contains("dynamodb:BatchGetItem"), "{name} may not BatchGetItem");
        }
    }
    assert_eq!(found, readers.len());
}

/// The calls the webhook functions make (the emulator does not enforce IAM,
/// so only this test sees a missing permission): the API function keeps
/// endpoints and their count in transactions; the notifier reads endpoints
/// and queues deliveries (and its event source describes failed records in
/// the dead-letter queue); deliver reads the endpoint and event (and, for a
/// held run.created, its run's second event), records attempts, claims retries, queues a retry as a new message and hides one
/// it could not attempt.
#[test]
fn the_webhook_functions_may_make_the_calls_they_make() {
    let template = template();
    let resources = &template["Resources"];
    let set = |actions: &[&str]| actions.iter().map(|action| action.to_string()).collect::<BTreeSet<_>>();
    let webhooks = &resources["WebhooksFunction"];
    assert_eq!(
        actions_on(webhooks, "RunsTable.Arn"),
        set(&["dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"])
    );
    let notifier = &resources["NotifierFunction"];
    assert_eq!(actions_on(notifier, "RunsTable.Arn"), set(&["dynamodb:Query"]));
    assert_eq!(actions_on(notifier, "WebhookDeliveryQueue.Arn"), set(&["sqs:SendMessage"]));
    assert_eq!(actions_on(notifier, "WebhookDeadLetterQueue.Arn"), set(&["sqs:SendMessage"]));
    let deliver = &resources["DeliverFunction"];
    assert_eq!(
        actions_on(deliver, "RunsTable.Arn"),
        set(&["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"])
    );
    assert_eq!(
        actions_on(deliver, "WebhookDeliveryQueue.Arn"),
        set(&["sqs:SendMessage", "sqs:ChangeMessageVisibility"])
    );
    let stream = &notifier["Properties"]["Events"]["EventItems"]["Properties"];
    assert_eq!(stream["FunctionResponseTypes"][0], "ReportBatchItemFailures");
    assert_eq!(stream["MaximumRetryAttempts"].as_i64(), Some(-1));
    assert_eq!(resources["RunsTable"]["Properties"]["StreamSpecification"]["StreamViewType"], "NEW_IMAGE");
    let queue = &resources["WebhookDeliveryQueue"]["Properties"];
    let deliver_timeout = deliver["Properties"]["Timeout"].as_u64().unwrap();
    assert!(queue["VisibilityTimeout"].as_u64().unwrap() >= 6 * deliver_timeout);
}

#[test]
fn a_create_is_answered_before_its_run_created_webhook_may_go() {
    // The create function's timeout bounds when a create whose run could
    // not be queued is undone; deliver holds a run.created until then.
    let template = template();
    let create = &template["Resources"]["CreateFunction"]["Properties"];
    let timeout = create["Timeout"].as_u64().or_else(|| template["Globals"]["Function"]["Timeout"].as_u64()).unwrap();
    assert!(
        std::time::Duration::from_secs(timeout) < agent_runs_service::webhooks::CREATE_SETTLED_AFTER,
        "the create function's timeout ({timeout} s) must end before run.created deliveries are released"
    );
}
