//! `agent-runs runs …` and `agent-runs approvals …`: the API from a
//! terminal. Talks HTTP to `--url` (a `serve` address or a deployed API
//! Gateway URL) with the key in `AGENT_RUNS_KEY`; tables for people,
//! `--json` for scripts.

use std::io::IsTerminal;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

mod show;

use show::Output;
pub(crate) use show::table;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Args)]
pub struct Connection {
    /// The API's base URL (without /v1).
    #[arg(long, env = "AGENT_RUNS_URL", default_value = "http://127.0.0.1:8080", global = true)]
    url: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Subcommand)]
#[command(after_help = "The API key is read from AGENT_RUNS_KEY.

Examples:
  agent-runs runs create --agent script --input 'approve Deploy v2'
  agent-runs runs list --status awaiting_approval
  agent-runs runs approve run_01JD... --comment 'go ahead'
  agent-runs runs approve run_01JD... --edit '{\"branch\": \"old\"}'
  agent-runs runs answer run_01JD... --text 'ENG-42'
  agent-runs runs answer run_01JD... --json '{\"env\": \"staging\"}'
  agent-runs runs watch run_01JD...      # exit 0 if it succeeds")]
pub enum RunsCommand {
    /// Start a run.
    Create {
        /// What the agent gets.
        #[arg(long)]
        input: String,
        /// The agent (the deployment's default when left out).
        #[arg(long)]
        agent: Option<String>,
        /// Metadata as KEY=VALUE (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Create at most once: a repeat with the same key returns the first run.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Continue an ended run's conversation with a new input (same agent).
    Continue {
        /// The run to continue: succeeded, failed or canceled.
        run_id: String,
        /// What the agent gets next (a defined agent's model sees the
        /// conversation so far, then this).
        #[arg(long)]
        input: String,
        /// Metadata as KEY=VALUE (repeatable).
        #[arg(long = "metadata", value_name = "KEY=VALUE")]
        metadata: Vec<String>,
        /// Create at most once: a repeat with the same key returns the first run.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// List runs, newest first.
    List {
        /// Only runs in this state (queued, running, awaiting_approval,
        /// succeeded, failed, canceled).
        #[arg(long)]
        status: Option<String>,
        /// Only the runs of this conversation: its first run's id (a run's
        /// thread_id).
        #[arg(long, value_name = "RUN_ID")]
        thread: Option<String>,
        /// At most this many (1 to 100, default 20).
        #[arg(long)]
        limit: Option<u32>,
        /// A next_cursor from an earlier page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Show a run.
    Get {
        /// The run (run_...).
        run_id: String,
    },
    /// Show a run's events, oldest first.
    Events {
        /// The run (run_...).
        run_id: String,
        /// Only events after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Follow a run's events until it ends; exit 0 only if it succeeded.
    Watch {
        /// The run (run_...).
        run_id: String,
    },
    /// Approve a run's pending approval (the only one, or APPROVAL_ID).
    Approve {
        /// The run (run_...).
        run_id: String,
        /// The approval (apr_...); needed when the run waits on several.
        approval_id: Option<String>,
        /// A note kept with the decision (the model is told it on an edit).
        #[arg(long)]
        comment: Option<String>,
        /// Approve a tool call with these arguments (JSON) instead.
        #[arg(long, value_name = "JSON")]
        edit: Option<String>,
        /// The call's arguments_sha256 as `runs get` showed it: the decision
        /// counts only for that exact call (409 otherwise).
        #[arg(long, value_name = "HEX")]
        sha256: Option<String>,
    },
    /// Reject a run's pending approval (the only one, or APPROVAL_ID).
    Reject {
        /// The run (run_...).
        run_id: String,
        /// The approval (apr_...); needed when the run waits on several.
        approval_id: Option<String>,
        /// Why: the model is told.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Answer a run's pending question (the only one, or APPROVAL_ID):
    /// `--text <TEXT>`, or `--json <JSON>` for a question whose schema wants
    /// more than a string (APPROVAL_ID before or after it).
    #[command(allow_negative_numbers = true)]
    Answer {
        /// The run (run_...).
        run_id: String,
        /// The question's approval (apr_...); needed when the run waits on several.
        approval_id: Option<String>,
        /// With --json: the answer as JSON (`--json` is also the flag for
        /// JSON output, so its value is read as an argument of its own).
        #[arg(hide = true)]
        answer_json: Option<String>,
        /// The answer as text (a JSON string).
        #[arg(long)]
        text: Option<String>,
        /// A note kept with the answer.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Cancel a run.
    Cancel {
        /// The run (run_...).
        run_id: String,
    },
}

#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// The approvals inbox: newest first, pending by default.
    List {
        /// pending (the default), approved, rejected, answered, expired or canceled.
        #[arg(long)]
        status: Option<String>,
        /// Only approvals of runs of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// action, tool_call or input (questions).
        #[arg(long)]
        kind: Option<String>,
        /// At most this many (1 to 100, default 20).
        #[arg(long)]
        limit: Option<u32>,
        /// A next_cursor from an earlier page.
        #[arg(long)]
        cursor: Option<String>,
    },
}

/// Writes to stdout; a reader that went away (`| head`) ends the program
/// quietly, as it does any command-line tool.
pub(crate) fn emit(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write the output: {error}");
        std::process::exit(2);
    }
}

/// What a command did, for the exit code.
pub enum Done {
    Ok,
    /// It worked, and what it reports is a failure (a watched run failed).
    Unsuccessful,
}

pub(crate) struct Api {
    http: reqwest::Client,
    url: String,
    key: String,
}

impl Api {
    pub(crate) fn new(connection: &Connection) -> Result<Api, Error> {
        let key = std::env::var("AGENT_RUNS_KEY")
            .ok()
            .filter(|key| !key.trim().is_empty())
            .ok_or("set AGENT_RUNS_KEY to an API key (`agent-runs keys create --owner <owner>` makes one)")?;
        agent_runs_platform::aws_sdk::use_ring_for_rustls();
        // No redirects: one would turn a POST into a GET of somewhere else.
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Api { http, url: connection.url.trim_end_matches('/').to_owned(), key })
    }

    /// Sends the request; the API's JSON answer, or its error's message.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        header: Option<(&str, &str)>,
    ) -> Result<Value, Error> {
        let url = format!("{}{path}", self.url);
        let mut request = self.http.request(method, &url).bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|error| format!("cannot reach {url}: {}", cause(&error)))?;
        let status = response.status();
        let text = response.text().await.map_err(|error| format!("{url}: the answer was cut off: {error}"))?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() && value.is_object() {
            return Ok(value);
        }
        if status.is_success() {
            return Err(format!(
                "{url} answered HTTP {} without the API's JSON; is it the API's URL?",
                status.as_u16()
            )
            .into());
        }
        match value["error"]["message"].as_str() {
            Some(message) => {
                let code = value["error"]["code"].as_str().unwrap_or("error");
                Err(format!("{message} (HTTP {}, {code})", status.as_u16()).into())
            }
            None => Err(format!("{url} answered HTTP {} without the API's error", status.as_u16()).into()),
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value, Error> {
        self.call(reqwest::Method::GET, path, None, None).await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Result<Value, Error> {
        self.call(reqwest::Method::POST, path, Some(body), None).await
    }
}

/// The innermost cause of a failed request: "Connection refused" rather
/// than "error sending request".
fn cause(error: &reqwest::Error) -> String {
    let mut last: &dyn std::error::Error = error;
    while let Some(source) = last.source() {
        last = source;
    }
    last.to_string()
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    let query = query.finish();
    if query.is_empty() { query } else { format!("?{query}") }
}

fn path_segment(id: &str) -> String {
    form_urlencoded::byte_serialize(id.as_bytes()).collect()
}

/// `--metadata KEY=VALUE` pairs as the JSON object the API takes.
fn metadata_object(pairs: &[String]) -> Result<serde_json::Map<String, Value>, String> {
    pairs
        .iter()
        .map(|pair| {
            let (key, value) = pair.split_once('=').ok_or_else(|| format!("--metadata {pair:?}: write KEY=VALUE"))?;
            Ok((key.to_owned(), Value::String(value.to_owned())))
        })
        .collect()
}

pub async fn runs(command: RunsCommand, connection: &Connection) -> Result<Done, Error> {
    let api = Api::new(connection)?;
    let out = Output { json: connection.json, colour: std::io::stdout().is_terminal() };
    match command {
        RunsCommand::Create { input, agent, metadata, idempotency_key } => {
            let mut body = json!({"input": input, "metadata": metadata_object(&metadata)?});
            if let Some(agent) = agent {
                body["agent"] = agent.into();
            }
            let post = reqwest::Method::POST;
            let header = idempotency_key.as_deref().map(|key| ("Idempotency-Key", key));
            out.run(&api.call(post, "/v1/agent/runs", Some(body), header).await?);
        }
        RunsCommand::Continue { run_id, input, metadata, idempotency_key } => {
            let body = json!({"input": input, "metadata": metadata_object(&metadata)?, "previous_run_id": run_id});
            let post = reqwest::Method::POST;
            let header = idempotency_key.as_deref().map(|key| ("Idempotency-Key", key));
            out.run(&api.call(post, "/v1/agent/runs", Some(body), header).await?);
        }
        RunsCommand::List { status, thread, limit, cursor } => {
            let limit = limit.map(|limit| limit.to_string());
            let path = format!(
                "/v1/agent/runs{}",
                query(&[("status", status), ("thread_id", thread), ("limit", limit), ("cursor", cursor)])
            );
            let page = api.get(&path).await?;
            out.runs(&page);
        }
        RunsCommand::Get { run_id } => out.run(&api.get(&format!("/v1/agent/runs/{}", path_segment(&run_id))).await?),
        RunsCommand::Events { run_id, mut after } => loop {
            let path = format!("/v1/agent/runs/{}/events?after={after}&limit=1000", path_segment(&run_id));
            let page = api.get(&path).await?;
            out.events(page["data"].as_array().map(Vec::as_slice).unwrap_or_default());
            match page["next_after"].as_u64() {
                Some(next) if page["has_more"] == true && next > after => after = next,
                _ => break,
            }
        },
        RunsCommand::Watch { run_id } => return watch(&api, &out, &run_id).await,
        RunsCommand::Approve { run_id, approval_id, comment, edit, sha256 } => {
            let mut body = json!({"decision": "approve", "comment": comment, "arguments_sha256": sha256});
            if let Some(edit) = edit {
                let arguments: Value =
                    serde_json::from_str(&edit).map_err(|error| format!("--edit is not JSON: {error}"))?;
                body["decision"] = "edit".into();
                body["arguments"] = arguments;
            }
            out.run(&decide(&api, &run_id, approval_id, PendingKind::Any, body).await?);
        }
        RunsCommand::Answer { run_id, approval_id, answer_json, text, comment } => {
            // Besides RUN_ID: the approval's id (apr_...) and, with --json,
            // the answer, in either order (JSON never reads as `apr_`).
            let mut given: Vec<String> = [approval_id, answer_json].into_iter().flatten().collect();
            let approval_id = given.iter().position(|arg| arg.starts_with("apr_")).map(|at| given.remove(at));
            let answer = match (text, given.as_slice()) {
                (Some(text), []) => Value::String(text),
                (None, [json]) if connection.json => parse_answer(json)?,
                (Some(_), [_, ..]) if connection.json => {
                    return Err("give the answer with --text or with --json, not both".into());
                }
                (_, [other, ..]) if !connection.json => {
                    return Err(format!("`{other}` is not an approval id (apr_...)").into());
                }
                _ => return Err("give the answer with --text <TEXT> or --json <JSON>".into()),
            };
            let body = json!({"decision": "answer", "answer": answer, "comment": comment});
            out.run(&decide(&api, &run_id, approval_id, PendingKind::Question, body).await?);
        }
        RunsCommand::Reject { run_id, approval_id, comment } => {
            let body = json!({"decision": "reject", "comment": comment});
            out.run(&decide(&api, &run_id, approval_id, PendingKind::Any, body).await?);
        }
        RunsCommand::Cancel { run_id } => {
            out.run(&api.post(&format!("/v1/agent/runs/{}/cancel", path_segment(&run_id)), json!({})).await?)
        }
    }
    Ok(Done::Ok)
}

pub async fn approvals(command: ApprovalsCommand, connection: &Connection) -> Result<Done, Error> {
    let api = Api::new(connection)?;
    let out = Output { json: connection.json, colour: std::io::stdout().is_terminal() };
    match command {
        ApprovalsCommand::List { status, agent, kind, limit, cursor } => {
            let limit = limit.map(|limit| limit.to_string());
            let path = format!(
                "/v1/approvals{}",
                query(&[("status", status), ("agent", agent), ("kind", kind), ("limit", limit), ("cursor", cursor)])
            );
            out.approvals(&api.get(&path).await?);
        }
    }
    Ok(Done::Ok)
}

fn parse_answer(json: &str) -> Result<Value, Error> {
    serde_json::from_str(json).map_err(|error| format!("the answer after --json is not JSON: {error}").into())
}

/// Which pending approvals a decision without an approval id may take.
#[derive(Clone, Copy, PartialEq)]
enum PendingKind {
    Any,
    /// An answer: only questions (`input`).
    Question,
}

/// Decides `approval_id`, or the run's only pending approval of `kind`.
async fn decide(
    api: &Api,
    run_id: &str,
    approval_id: Option<String>,
    kind: PendingKind,
    body: Value,
) -> Result<Value, Error> {
    let run_path = format!("/v1/agent/runs/{}", path_segment(run_id));
    let approval_id = match approval_id {
        Some(id) => id,
        None => {
            let run = api.get(&run_path).await?;
            let pending: Vec<&str> = run["pending_approvals"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|approval| approval["status"] == "pending")
                .filter(|approval| kind == PendingKind::Any || approval["kind"] == "input")
                .filter_map(|approval| approval["id"].as_str())
                .collect();
            let what = if kind == PendingKind::Question { "question" } else { "approval" };
            match pending.as_slice() {
                [only] => (*only).to_owned(),
                [] => return Err(format!("{run_id} has no pending {what}").into()),
                several => {
                    return Err(format!(
                        "{run_id} has {} pending {what}s; name one: {}",
                        several.len(),
                        several.join(", ")
                    )
                    .into());
                }
            }
        }
    };
    api.post(&format!("{run_path}/approvals/{}", path_segment(&approval_id)), body).await
}

/// Prints the run's events as they come (long-polling `wait`) until its
/// last one; `Unsuccessful` unless it succeeded.
async fn watch(api: &Api, out: &Output, run_id: &str) -> Result<Done, Error> {
    let mut after = 0;
    loop {
        let path = format!("/v1/agent/runs/{}/events?after={after}&limit=1000&wait=20", path_segment(run_id));
        let page = api.get(&path).await?;
        let events = page["data"].as_array().map(Vec::as_slice).unwrap_or_default();
        out.events(events);
        after = page["next_after"].as_u64().unwrap_or(after);
        let ended = events.iter().rev().find_map(|event| match event["type"].as_str() {
            Some("run.succeeded") => Some(Done::Ok),
            Some("run.failed" | "run.canceled") => Some(Done::Unsuccessful),
            _ => None,
        });
        if let Some(done) = ended {
            return Ok(done);
        }
    }
}
