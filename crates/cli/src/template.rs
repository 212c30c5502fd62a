//! The Lambda functions of `template.yaml`, generated: each function's
//! resource, log group and alarms come from [`FUNCTIONS`] and, for the
//! functions behind the HTTP API, their routes from the route table. The
//! rest of the template (table, queues, API, dashboard) is written by hand.
//! `agent-runs template --write template.yaml` rewrites the generated part;
//! a test fails while it differs from what this module makes.

use std::fmt::Write as _;

use agent_runs_service::api::ROUTES;
use agent_runs_service::api::routes::FALLBACK_FUNCTION;

/// The lines around the generated part of the template.
pub const BEGIN: &str =
    "  # BEGIN FUNCTIONS: made by `agent-runs template` from crates/cli/src/template.rs; edit there.\n";
pub const END: &str = "  # END FUNCTIONS\n";

/// One Lambda function: what it is, what starts it, and what it may do.
pub struct Function {
    /// The binary, its `functions/<name>` crate and its name in the stack.
    pub name: &'static str,
    pub description: &'static str,
    /// Seconds; the template's global (10) where `None`.
    pub timeout: Option<u32>,
    /// MB; the template's global (256) where `None`.
    pub memory: Option<u32>,
    /// Properties beyond the usual, as YAML lines (indented as properties).
    pub extra: &'static str,
    /// Environment variables beyond the global ones: name, YAML value.
    pub environment: &'static [(&'static str, &'static str)],
    pub grants: &'static [Grant],
    pub trigger: Trigger,
}

/// What a function may do, an IAM statement each.
pub enum Grant {
    /// These DynamoDB actions on the table.
    Table(&'static [&'static str]),
    /// Queries of these indexes of the table.
    Indexes(&'static [&'static str]),
    /// These SQS actions on the queue of that logical id.
    Queue(&'static str, &'static [&'static str]),
    /// Model calls on Amazon Bedrock (defined agents).
    Bedrock,
    /// These KMS actions on the receipt signing key.
    SigningKey(&'static [&'static str]),
}

/// What invokes a function.
pub enum Trigger {
    /// Its routes of the route table, through the HTTP API.
    Routes,
    /// The HTTP API's `$default` route: every request no route matches.
    Fallback,
    /// Another event source: its `Events` entries as YAML lines.
    Events(&'static str),
}

const RUN_QUEUE_URL: (&str, &str) = ("AGENT_RUNS_QUEUE_URL", "!Ref RunQueue");
const RECEIPT_KEY_ID: (&str, &str) = ("AGENT_RUNS_RECEIPT_KEY_ID", "!Ref ReceiptSigningKey");
const WEBHOOK_QUEUE_URL: (&str, &str) = ("AGENT_RUNS_WEBHOOK_QUEUE_URL", "!Ref WebhookDeliveryQueue");
/// What changing a run takes: the read, the Query of its last event (when
/// its count fell behind its log) and the conditional transaction.
const CHANGE_RUNS: Grant = Grant::Table(&["GetItem", "Query", "PutItem", "UpdateItem", "DeleteItem"]);
/// Sending a run's id to the workers (the queue's attributes: the warm-up's
/// first call, which opens the connection).
const SEND_RUNS: Grant = Grant::Queue("RunQueue", &["SendMessage", "GetQueueAttributes"]);

pub const FUNCTIONS: [Function; 18] = [
    Function {
        name: "create",
        description: "POST /v1/agent/runs: create a run",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[RUN_QUEUE_URL],
        // GetItem: the key lookup; BatchGetItem: the items of the
        // active-run count, when the run's own one is full, and the run a
        // continuation continues with the state it ended with.
        grants: &[Grant::Table(&["GetItem", "BatchGetItem", "PutItem", "UpdateItem", "DeleteItem"]), SEND_RUNS],
        trigger: Trigger::Routes,
    },
    Function {
        name: "list",
        description: "GET /v1/agent/runs: list runs",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        // BatchGetItem: the runs of a page (a thread's too, read by their
        // entries' Query).
        grants: &[Grant::Table(&["GetItem", "BatchGetItem", "Query"]), Grant::Indexes(&["gsi1"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "approvals",
        description: "GET /v1/approvals: the approvals inbox",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        grants: &[Grant::Table(&["GetItem", "BatchGetItem"]), Grant::Indexes(&["gsi3"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "get",
        description: "GET /v1/agent/runs/{run_id}: get a run",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        grants: &[Grant::Table(&["GetItem"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "events",
        description: "GET /v1/agent/runs/{run_id}/events: a run's events (holds a ?wait request up to 10 s)",
        // A held request is one execution for its whole wait: held at most
        // 10 s here, by at most EventsConcurrency executions at once.
        timeout: Some(20),
        memory: None,
        extra: "ReservedConcurrentExecutions: !If [ReserveEventsConcurrency, !Ref EventsConcurrency, !Ref AWS::NoValue]\n",
        environment: &[("AGENT_RUNS_MAX_WAIT_SECS", "\"10\"")],
        grants: &[Grant::Table(&["GetItem", "Query"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "cancel",
        description: "POST /v1/agent/runs/{run_id}/cancel",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        grants: &[CHANGE_RUNS],
        trigger: Trigger::Routes,
    },
    Function {
        name: "decide",
        description: "POST /v1/agent/runs/{run_id}/approvals/{approval_id}",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[RUN_QUEUE_URL],
        grants: &[CHANGE_RUNS, SEND_RUNS],
        trigger: Trigger::Routes,
    },
    Function {
        name: "decide-batch",
        description: "POST /v1/approvals/batch: up to 100 decisions, all or nothing",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[RUN_QUEUE_URL],
        grants: &[CHANGE_RUNS, SEND_RUNS],
        trigger: Trigger::Routes,
    },
    Function {
        name: "extend",
        description: "POST /v1/agent/runs/{run_id}/approvals/{approval_id}/extend",
        timeout: None,
        memory: None,
        extra: "",
        // An extension (or the expiry it finds) never sends the run.
        environment: &[],
        grants: &[CHANGE_RUNS],
        trigger: Trigger::Routes,
    },
    Function {
        name: FALLBACK_FUNCTION,
        description: "$default route: 404 and 405 in the contract's format",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        grants: &[Grant::Table(&["GetItem"])],
        trigger: Trigger::Fallback,
    },
    Function {
        name: "worker",
        description: "Executes runs from the queue",
        timeout: Some(300),
        memory: Some(512),
        extra: "",
        // Approval receipts: signed by the KMS key, naming the API as issuer.
        environment: &[
            RUN_QUEUE_URL,
            RECEIPT_KEY_ID,
            ("AGENT_RUNS_ISSUER", "!Sub \"https://${Api}.execute-api.${AWS::Region}.${AWS::URLSuffix}\""),
        ],
        grants: &[CHANGE_RUNS, SEND_RUNS, Grant::Bedrock, Grant::SigningKey(&["Sign", "GetPublicKey"])],
        trigger: Trigger::Events(
            "RunMessages:
  Type: SQS
  Properties:
    Queue: !GetAtt RunQueue.Arn
    BatchSize: 10
    MaximumBatchingWindowInSeconds: 0
    FunctionResponseTypes:
      - ReportBatchItemFailures
    ScalingConfig:
      MaximumConcurrency: !Ref WorkerConcurrency
",
        ),
    },
    Function {
        name: "sweeper",
        description: "Re-enqueues lost runs and recovers expired leases",
        timeout: Some(60),
        memory: None,
        extra: "",
        // The receipt key: the sweeper publishes its public part, so the
        // JWKS shows it a minute after a deploy, before any receipt.
        environment: &[RUN_QUEUE_URL, RECEIPT_KEY_ID],
        // BatchGetItem: the runs an item of an active-run count holds
        // places for, at its recount.
        grants: &[
            Grant::Table(&["GetItem", "BatchGetItem", "Query", "PutItem", "UpdateItem", "DeleteItem"]),
            Grant::Indexes(&["gsi2"]),
            SEND_RUNS,
            Grant::SigningKey(&["GetPublicKey"]),
        ],
        trigger: Trigger::Events(
            "EveryMinute:
  Type: Schedule
  Properties:
    Schedule: rate(1 minute)
    Description: Re-enqueue lost runs and recover expired leases.
",
        ),
    },
    Function {
        name: "dead-letter",
        description: "Fails the runs whose queue messages were dead-lettered",
        timeout: Some(60),
        memory: None,
        extra: "",
        environment: &[],
        grants: &[CHANGE_RUNS],
        trigger: Trigger::Events(
            "DeadLetters:
  Type: SQS
  Properties:
    Queue: !GetAtt DeadLetterQueue.Arn
    BatchSize: 10
    FunctionResponseTypes:
      - ReportBatchItemFailures
",
        ),
    },
    Function {
        name: "webhooks",
        description: "/v1/webhooks: endpoints, secrets and delivery attempts",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        // Endpoints and their count are written in one transaction.
        grants: &[Grant::Table(&["GetItem", "Query", "PutItem", "UpdateItem", "DeleteItem"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "policies",
        description: "/v1/policies: the owner's approval policy, and rules tried on its history",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        // A test replays up to 10,000 decisions read from their index.
        grants: &[Grant::Table(&["GetItem", "UpdateItem"]), Grant::Indexes(&["gsi4"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "directory",
        description: "GET /v1/keys and GET /v1/agents/{agent}: the owner's keys by name, an agent's settings",
        timeout: None,
        memory: None,
        extra: "",
        environment: &[],
        // An agent's definition; the owner's keys from the status index.
        grants: &[Grant::Table(&["GetItem"]), Grant::Indexes(&["gsi1"])],
        trigger: Trigger::Routes,
    },
    Function {
        name: "notifier",
        description: "Queues a webhook delivery for each new event item of the table's stream",
        timeout: Some(30),
        memory: None,
        extra: "",
        environment: &[WEBHOOK_QUEUE_URL],
        // Query: the owner's endpoints, one per owner in a batch; records
        // that fail every retry are described on the dead-letter queue.
        grants: &[
            Grant::Table(&["Query"]),
            Grant::Queue("WebhookDeliveryQueue", &["SendMessage"]),
            Grant::Queue("WebhookDeadLetterQueue", &["SendMessage"]),
        ],
        // Retried until the record leaves the stream (24 h), halving the
        // batch around a record that keeps failing.
        trigger: Trigger::Events(
            r#"EventItems:
  Type: DynamoDB
  Properties:
    Stream: !GetAtt RunsTable.StreamArn
    StartingPosition: TRIM_HORIZON
    BatchSize: 100
    MaximumBatchingWindowInSeconds: 1
    MaximumRetryAttempts: -1
    BisectBatchOnFunctionError: true
    FunctionResponseTypes:
      - ReportBatchItemFailures
    DestinationConfig:
      OnFailure:
        Type: SQS
        Destination: !GetAtt WebhookDeadLetterQueue.Arn
    FilterCriteria:
      Filters:
        - Pattern: '{"eventName": ["INSERT"], "dynamodb": {"NewImage": {"sk": {"S": [{"prefix": "EV#"}]}}}}'
"#,
        ),
    },
    Function {
        name: "deliver",
        description: "Sends signed webhook deliveries; schedules retries",
        // Deliveries of a batch go out together, each with 15 s to answer.
        timeout: Some(30),
        memory: None,
        extra: "",
        environment: &[WEBHOOK_QUEUE_URL],
        // The endpoint and the event (and a held run.created's run's second
        // one); the attempt, the endpoint's health and the claim of a retry
        // (so a repeated message queues it once). A failed delivery's next
        // attempt is a new message; one that could not be attempted is
        // hidden for a while.
        grants: &[
            Grant::Table(&["GetItem", "PutItem", "UpdateItem"]),
            Grant::Queue("WebhookDeliveryQueue", &["SendMessage", "ChangeMessageVisibility"]),
        ],
        trigger: Trigger::Events(
            "Deliveries:
  Type: SQS
  Properties:
    Queue: !GetAtt WebhookDeliveryQueue.Arn
    BatchSize: 10
    MaximumBatchingWindowInSeconds: 0
    FunctionResponseTypes:
      - ReportBatchItemFailures
    ScalingConfig:
      MaximumConcurrency: 20
",
        ),
    },
];

/// The function's logical id in the template: `decide-batch` is
/// `DecideBatchFunction`.
pub fn logical_id(name: &str) -> String {
    let mut id: String = name
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map(|first| first.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
        })
        .collect();
    id.push_str("Function");
    id
}

/// The generated part of the template, from [`BEGIN`] to [`END`].
pub fn functions_yaml() -> String {
    let mut yaml = String::from(BEGIN);
    for function in &FUNCTIONS {
        yaml.push('\n');
        write_function(&mut yaml, function);
    }
    yaml.push_str(END);
    yaml
}

/// `template` with its generated part replaced by [`functions_yaml`];
/// `None` when it has no generated part.
pub fn regenerate(template: &str) -> Option<String> {
    let start = template.find(BEGIN)?;
    let end = template[start..].find(END)? + start + END.len();
    Some(format!("{}{}{}", &template[..start], functions_yaml(), &template[end..]))
}

/// The header of the `cargo lambda watch` router in the workspace manifest.
pub const ROUTER: &str = "[workspace.metadata.lambda.watch.router]\n";

/// The `cargo lambda watch` router: each path's routes, from the route
/// table, in its order.
pub fn watch_router_toml() -> String {
    let mut paths: Vec<&str> = Vec::new();
    for route in ROUTES.iter().filter(|route| route.has_gateway_route()) {
        if !paths.contains(&route.path) {
            paths.push(route.path);
        }
    }
    let mut toml = String::from(ROUTER);
    for path in paths {
        let targets: Vec<String> = ROUTES
            .iter()
            .filter(|route| route.path == path && route.has_gateway_route())
            .map(|route| format!("{{ method = \"{}\", function = \"{}\" }}", route.method, route.function))
            .collect();
        let _ = writeln!(toml, "\"{path}\" = [{}]", targets.join(", "));
    }
    toml
}

/// `manifest` (the workspace's Cargo.toml) with its router, the [`ROUTER`]
/// line (at the start of a line) and the `"<path>" = [...]` lines after it,
/// replaced by [`watch_router_toml`].
pub fn regenerate_router(manifest: &str) -> Option<String> {
    let start =
        manifest.match_indices(ROUTER).map(|(at, _)| at).find(|at| *at == 0 || manifest[..*at].ends_with('\n'))?;
    let mut end = start + ROUTER.len();
    while end < manifest.len() && manifest[end..].starts_with('"') {
        end = manifest[end..].find('\n').map_or(manifest.len(), |line| end + line + 1);
    }
    Some(format!("{}{}{}", &manifest[..start], watch_router_toml(), &manifest[end..]))
}

/// Appends `text`'s lines, each indented by `indent` spaces.
fn indented(yaml: &mut String, indent: usize, text: &str) {
    for line in text.lines() {
        let _ = writeln!(yaml, "{:indent$}{line}", "");
    }
}

/// A YAML value: a scalar when there is one, else a list.
fn one_or_list(yaml: &mut String, indent: usize, key: &str, values: &[String]) {
    match values {
        [one] => {
            let _ = writeln!(yaml, "{:indent$}{key}: {one}", "");
        }
        many => {
            let _ = writeln!(yaml, "{:indent$}{key}:", "");
            for value in many {
                let _ = writeln!(yaml, "{:indent$}  - {value}", "");
            }
        }
    }
}

fn write_grant(yaml: &mut String, grant: &Grant) {
    let prefixed =
        |service: &str, actions: &[&str]| actions.iter().map(|action| format!("{service}:{action}")).collect();
    let (actions, resources): (Vec<String>, Vec<String>) = match grant {
        Grant::Table(actions) => (prefixed("dynamodb", actions), vec!["!GetAtt RunsTable.Arn".into()]),
        Grant::Indexes(indexes) => (
            vec!["dynamodb:Query".into()],
            indexes.iter().map(|index| format!("!Sub \"${{RunsTable.Arn}}/index/{index}\"")).collect(),
        ),
        Grant::Queue(queue, actions) => (prefixed("sqs", actions), vec![format!("!GetAtt {queue}.Arn")]),
        Grant::SigningKey(actions) => (prefixed("kms", actions), vec!["!GetAtt ReceiptSigningKey.Arn".into()]),
        Grant::Bedrock => (
            vec!["bedrock:InvokeModel".into()],
            vec![
                "!Sub \"arn:${AWS::Partition}:bedrock:*::foundation-model/*\"".into(),
                "!Sub \"arn:${AWS::Partition}:bedrock:*:${AWS::AccountId}:inference-profile/*\"".into(),
            ],
        ),
    };
    yaml.push_str("            - Effect: Allow\n");
    one_or_list(yaml, 14, "Action", &actions);
    one_or_list(yaml, 14, "Resource", &resources);
}

fn write_events(yaml: &mut String, function: &Function) {
    yaml.push_str("      Events:\n");
    let http = |yaml: &mut String, index: usize, method: &str, path: &str| {
        let _ = write!(
            yaml,
            "        Http{index}:\n          Type: HttpApi\n          Properties:\n            ApiId: !Ref Api\n            \
             Method: {method}\n            Path: {path}\n"
        );
    };
    match function.trigger {
        Trigger::Routes => {
            let routes = ROUTES.iter().filter(|route| route.function == function.name && route.has_gateway_route());
            for (index, route) in routes.enumerate() {
                http(yaml, index, route.method.as_str(), route.path);
            }
        }
        Trigger::Fallback => http(yaml, 0, "ANY", "$default"),
        Trigger::Events(events) => indented(yaml, 8, events),
    }
}

fn write_function(yaml: &mut String, function: &Function) {
    let id = logical_id(function.name);
    let name = function.name;
    let _ = write!(
        yaml,
        "  {id}:
    Type: AWS::Serverless::Function
    Metadata:
      BuildMethod: rust-cargolambda
      BuildProperties:
        Binary: {name}
    Properties:
      FunctionName: !Sub \"${{AWS::StackName}}-{name}\"
      Description: \"{description}\"
      CodeUri: .
",
        description = function.description
    );
    if let Some(timeout) = function.timeout {
        let _ = writeln!(yaml, "      Timeout: {timeout}");
    }
    if let Some(memory) = function.memory {
        let _ = writeln!(yaml, "      MemorySize: {memory}");
    }
    indented(yaml, 6, function.extra);
    let _ = write!(yaml, "      LoggingConfig:\n        LogFormat: JSON\n        LogGroup: !Ref {id}Logs\n");
    if !function.environment.is_empty() {
        yaml.push_str("      Environment:\n        Variables:\n");
        for (variable, value) in function.environment {
            let _ = writeln!(yaml, "          {variable}: {value}");
        }
    }
    yaml.push_str("      Policies:\n        - Version: \"2012-10-17\"\n          Statement:\n");
    for grant in function.grants {
        write_grant(yaml, grant);
    }
    write_events(yaml, function);
    let _ = write!(
        yaml,
        "
  {id}Logs:
    Type: AWS::Logs::LogGroup
    Properties:
      LogGroupName: !Sub \"/aws/lambda/${{AWS::StackName}}-{name}\"
      RetentionInDays: !Ref LogRetentionDays
"
    );
    write_alarm(
        yaml,
        &id,
        "Errors",
        &format!("{name}: the function raised errors (a defect or a failing dependency); see its log group."),
    );
    write_alarm(
        yaml,
        &id,
        "Throttles",
        &format!("{name}: invocations were throttled (account or reserved concurrency exhausted)."),
    );
}

fn write_alarm(yaml: &mut String, id: &str, metric: &str, description: &str) {
    let _ = write!(
        yaml,
        "
  {id}{metric}:
    Type: AWS::CloudWatch::Alarm
    Properties:
      AlarmDescription: \"{description}\"
      Namespace: AWS/Lambda
      MetricName: {metric}
      Dimensions:
        - Name: FunctionName
          Value: !Ref {id}
      Statistic: Sum
      Period: 300
      EvaluationPeriods: 1
      Threshold: 1
      ComparisonOperator: GreaterThanOrEqualToThreshold
      TreatMissingData: notBreaching
      AlarmActions: !If [HasAlarmTopic, [!Ref AlarmTopicArn], !Ref AWS::NoValue]
"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router is found at the start of a line only, and ends at its
    /// last entry whatever follows (a comment, another table, the end).
    #[test]
    fn the_router_is_replaced_and_nothing_around_it() {
        let routes = watch_router_toml();
        for after in ["", "\n[profile.x]\nlto = false\n", "# a comment\n[profile.x]\n"] {
            let before = format!("# {ROUTER}[a]\nb = 1\n");
            let manifest = format!("{before}{ROUTER}\"/old\" = [{{ method = \"GET\", function = \"old\" }}]\n{after}");
            assert_eq!(regenerate_router(&manifest).unwrap(), format!("{before}{routes}{after}"));
        }
        assert_eq!(regenerate_router(&format!("# {ROUTER}")), None, "a commented header is no router");
    }
}
