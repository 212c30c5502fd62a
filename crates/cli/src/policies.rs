//! `agent-runs policies …`: the owner's approval policy through the HTTP
//! API (scope `policies:manage` to put and test).

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::Value;

use crate::client::{Api, Connection, Done, Error, emit};

#[derive(Subcommand)]
#[command(after_help = "The API key is read from AGENT_RUNS_KEY; a rules file is {\"rules\": [...]}.

Examples:
  agent-runs policies test --file rules.json --limit 5000
  agent-runs policies put --file rules.json --if-match 3
  agent-runs policies get")]
pub enum PoliciesCommand {
    /// Show the policy in force.
    Get,
    /// Replace the policy with the rules of FILE.
    Put {
        /// The rules as JSON (`{"rules": [...]}`, docs/api.md).
        #[arg(long)]
        file: PathBuf,
        /// Only if the policy is still at this version (its ETag).
        #[arg(long, value_name = "VERSION")]
        if_match: Option<u64>,
    },
    /// Try the rules of FILE on the calls people decided; changes nothing.
    Test {
        /// The rules to try, as JSON.
        #[arg(long)]
        file: PathBuf,
        /// How many of the most recent decisions (1 to 10000).
        #[arg(long)]
        limit: Option<u64>,
    },
}

fn rules_file(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| format!("{} is not JSON: {error}", path.display()).into())
}

pub async fn run(command: PoliciesCommand, connection: &Connection) -> Result<Done, Error> {
    let api = Api::new(connection)?;
    let answer = match command {
        PoliciesCommand::Get => api.get("/v1/policies").await?,
        PoliciesCommand::Put { file, if_match } => {
            let version = if_match.map(|version| format!("\"{version}\""));
            let header = version.as_deref().map(|version| ("If-Match", version));
            api.call(reqwest::Method::PUT, "/v1/policies", Some(rules_file(&file)?), header).await?
        }
        PoliciesCommand::Test { file, limit } => {
            let mut body = rules_file(&file)?;
            if let (Some(limit), Some(object)) = (limit, body.as_object_mut()) {
                object.insert("limit".into(), limit.into());
            }
            let result = api.post("/v1/policies/test", body).await?;
            if !connection.json {
                emit(&test_table(&result));
                return Ok(Done::Ok);
            }
            result
        }
    };
    if connection.json {
        emit(&format!("{answer}\n"));
    } else {
        emit(&policy_table(&answer));
    }
    Ok(Done::Ok)
}

fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

/// The policy, one rule per line.
fn policy_table(policy: &Value) -> String {
    let mut out = match (&policy["updated_at"], &policy["updated_by"]) {
        // The default policy: never written.
        (Value::Null, _) => format!("version {}  (the default: never set)\n", policy["version"]),
        (at, by) => format!("version {}  updated {} by {}\n", policy["version"], text(at), text(by)),
    };
    out.push_str(&format!("{:<24} {:<8} {:<9} {:<16} {:<20} WHEN\n", "RULE", "EFFECT", "MODE", "AGENT", "TOOL"));
    for rule in policy["rules"].as_array().into_iter().flatten() {
        let when: Vec<String> = rule["when"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|condition| format!("{} {} {}", text(&condition["path"]), text(&condition["op"]), condition["value"]))
            .collect();
        out.push_str(&format!(
            "{:<24} {:<8} {:<9} {:<16} {:<20} {}\n",
            text(&rule["id"]),
            text(&rule["effect"]),
            text(&rule["mode"]),
            text(&rule["agent"]),
            text(&rule["tool"]),
            when.join(" and ")
        ));
    }
    out
}

/// What a test found, for a person deciding whether to switch rules on.
fn test_table(result: &Value) -> String {
    let mut out = format!(
        "{} decisions replayed: {} would be allowed, {} denied, {} still asked\n\n",
        result["evaluated"], result["would_allow"], result["would_deny"], result["would_ask"]
    );
    out.push_str(&format!("{:<24} {:>8} {:>8} {:>10}\n", "RULE", "MATCHED", "AGREED", "DISAGREED"));
    for (rule, tally) in result["rules"].as_object().into_iter().flatten() {
        // A JSON value ignores widths: the counts as numbers, to line up.
        let count = |name: &str| tally[name].as_u64().unwrap_or_default();
        out.push_str(&format!(
            "{rule:<24} {:>8} {:>8} {:>10}\n",
            count("matched"),
            count("agreed"),
            count("disagreed")
        ));
    }
    let disagreements = result["disagreements"].as_array().map_or(&[][..], Vec::as_slice);
    if !disagreements.is_empty() {
        out.push_str("\nDisagreements (newest first):\n");
        for disagreement in disagreements {
            out.push_str(&format!(
                "  {} {} {}: a person {}, {} would {}  ({} {})\n",
                text(&disagreement["agent"]),
                text(&disagreement["tool"]),
                disagreement["arguments"],
                text(&disagreement["human"]),
                text(&disagreement["rule"]),
                text(&disagreement["effect"]),
                text(&disagreement["run_id"]),
                text(&disagreement["approval_id"])
            ));
        }
    }
    out
}
