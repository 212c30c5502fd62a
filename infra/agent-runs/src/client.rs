//! `agent-runs runs …` and `agent-runs approvals …`: the API from a
//! terminal. Talks HTTP to `--url` (a `serve` address or a deployed API
//! Gateway URL) with the key in `AGENT_RUNS_KEY`; tables for people,
//! `--json` for scripts.

use std::io::IsTerminal;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

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
    /// more than a string (the JSON follows the ids).
    Answer {
        /// The run (run_...).
        run_id: String,
        /// The question's approval (apr_...); needed when the run waits on several.
        approval_id: Option<String>,
        /// With --json: the answer as JSON (when APPROVAL_ID is left out,
        /// the argument after RUN_ID).
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
        agent_runs_shared::sdk::use_ring_for_rustls();
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
            out.run(&decide(&api, &run_id, approval_id, body).await?);
        }
        RunsCommand::Answer { run_id, approval_id, answer_json, text, comment } => {
            // `--json` is also the flag for JSON output: with it, the last
            // argument after the ids is the answer.
            let (approval_id, answer) = match (text, answer_json, approval_id) {
                (Some(text), None, approval_id) => (approval_id, Value::String(text)),
                (None, Some(json), approval_id) if connection.json => (approval_id, parse_answer(&json)?),
                (None, None, Some(json)) if connection.json => (None, parse_answer(&json)?),
                _ => return Err("give the answer with --text <TEXT> or --json <JSON>".into()),
            };
            let body = json!({"decision": "answer", "answer": answer, "comment": comment});
            out.run(&decide(&api, &run_id, approval_id, body).await?);
        }
        RunsCommand::Reject { run_id, approval_id, comment } => {
            let body = json!({"decision": "reject", "comment": comment});
            out.run(&decide(&api, &run_id, approval_id, body).await?);
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

/// Decides `approval_id`, or the run's only pending approval.
async fn decide(api: &Api, run_id: &str, approval_id: Option<String>, body: Value) -> Result<Value, Error> {
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
                .filter_map(|approval| approval["id"].as_str())
                .collect();
            match pending.as_slice() {
                [only] => (*only).to_owned(),
                [] => return Err(format!("{run_id} has no pending approval").into()),
                several => {
                    return Err(format!(
                        "{run_id} has {} pending approvals; name one: {}",
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

/// How results are shown.
struct Output {
    pub(crate) json: bool,
    colour: bool,
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `text` on one line, at most `width` characters.
fn cell(value: &Value, width: usize) -> String {
    let one_line: String = text(value).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if one_line.chars().count() <= width {
        return one_line;
    }
    let mut short: String = one_line.chars().take(width.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// How wide `cell` shows on a terminal: its characters, colour codes left out.
fn shown_width(cell: &str) -> usize {
    let mut width = 0;
    let mut in_escape = false;
    for c in cell.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

/// How long ago `at` (RFC 3339) was, as `42s`, `3m`, `5h` or `2d`.
fn ago(at: &Value) -> String {
    let Some(then) = at.as_str().and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok()) else {
        return text(at);
    };
    span((chrono::Utc::now() - then.to_utc()).num_seconds().max(0))
}

/// How long until `at` ("12m"), or `at` as given when it cannot be read.
fn until(at: &Value) -> String {
    let Some(then) = at.as_str().and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok()) else {
        return text(at);
    };
    span((then.to_utc() - chrono::Utc::now()).num_seconds().max(0))
}

fn span(seconds: i64) -> String {
    match seconds {
        0..90 => format!("{seconds}s"),
        90..5_400 => format!("{}m", (seconds + 30) / 60),
        5_400..172_800 => format!("{}h", (seconds + 1_800) / 3_600),
        _ => format!("{}d", (seconds + 43_200) / 86_400),
    }
}

pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().filter_map(|row| row.get(i)).map(|c| shown_width(c)).max().unwrap_or(0))
        .collect();
    let mut lines = String::new();
    for row in rows {
        let padded: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell}{}", " ".repeat(width - shown_width(cell))))
            .collect();
        lines.push_str(padded.join("  ").trim_end());
        lines.push('\n');
    }
    lines
}

impl Output {
    fn status(&self, status: &Value) -> String {
        let name = text(status);
        let code = match name.as_str() {
            "succeeded" | "approved" | "answered" => "32",
            "failed" | "rejected" | "expired" => "31",
            "awaiting_approval" | "pending" => "33",
            "canceled" => "90",
            _ => return name,
        };
        if self.colour { format!("\x1b[{code}m{name}\x1b[0m") } else { name }
    }

    fn print_json(value: &Value) {
        emit(&format!("{}\n", serde_json::to_string_pretty(value).unwrap_or_default()));
    }

    fn run(&self, run: &Value) {
        if self.json {
            return Self::print_json(run);
        }
        let mut rows = vec![
            vec!["id".into(), text(&run["id"])],
            vec!["status".into(), self.status(&run["status"])],
            vec!["agent".into(), text(&run["agent"])],
            vec!["created".into(), text(&run["created_at"])],
            vec!["input".into(), cell(&run["input"], 100)],
        ];
        if let Some(previous) = run["previous_run_id"].as_str() {
            rows.push(vec!["continues".into(), format!("{previous} (thread {})", text(&run["thread_id"]))]);
        }
        for (name, key) in [("output", "output"), ("error", "error")] {
            if !run[key].is_null() {
                rows.push(vec![name.into(), cell(&run[key], 100)]);
            }
        }
        for approval in run["pending_approvals"].as_array().into_iter().flatten() {
            let status = self.status(&approval["status"]);
            let line = format!("{} {status} {}", text(&approval["id"]), cell(&approval["action"], 200));
            rows.push(vec!["approval".into(), line]);
            if !approval["arguments"].is_null() {
                rows.push(vec!["  arguments".into(), approval["arguments"].to_string()]);
                rows.push(vec!["  sha256".into(), text(&approval["arguments_sha256"])]);
            }
            if approval["status"] == "pending" && approval["auto_approves_at"].is_string() {
                let veto = format!("in {} unless someone rejects it", until(&approval["auto_approves_at"]));
                rows.push(vec!["  auto-approves".into(), veto]);
            }
            if approval["tool_changed"] == true {
                rows.push(vec!["  warning".into(), "the tool changed on its MCP server since it was pinned".into()]);
            }
            for (name, key) in [("  edited to", "edited_arguments"), ("  answer", "answer")] {
                if !approval[key].is_null() {
                    rows.push(vec![name.into(), approval[key].to_string()]);
                }
            }
            for (name, key) in [("  decided by", "resolved_by"), ("  comment", "comment")] {
                if !approval[key].is_null() {
                    rows.push(vec![name.into(), cell(&approval[key], 200)]);
                }
            }
        }
        emit(&table(&rows));
    }

    fn runs(&self, page: &Value) {
        if self.json {
            return Self::print_json(page);
        }
        let mut rows = vec![vec!["ID".into(), "STATUS".into(), "AGENT".into(), "CREATED".into(), "INPUT".into()]];
        for run in page["data"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&run["id"]),
                self.status(&run["status"]),
                text(&run["agent"]),
                text(&run["created_at"]),
                cell(&run["input"], 40),
            ]);
        }
        emit(&table(&rows));
        if let Some(cursor) = page["next_cursor"].as_str() {
            emit(&format!("more: --cursor {cursor}\n"));
        }
    }

    fn approvals(&self, page: &Value) {
        if self.json {
            return Self::print_json(page);
        }
        let mut rows = vec![vec![
            "RUN".into(),
            "APPROVAL".into(),
            "STATUS".into(),
            "AGENT".into(),
            "WAITING".into(),
            "ACTION".into(),
        ]];
        for approval in page["data"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&approval["run_id"]),
                text(&approval["id"]),
                self.status(&approval["status"]),
                text(&approval["agent"]),
                match approval["auto_approves_at"].as_str() {
                    Some(_) if approval["status"] == "pending" => {
                        format!("{}, auto in {}", ago(&approval["requested_at"]), until(&approval["auto_approves_at"]))
                    }
                    _ => ago(&approval["requested_at"]),
                },
                cell(&approval["action"], 60),
            ]);
        }
        emit(&table(&rows));
        if let Some(cursor) = page["next_cursor"].as_str() {
            emit(&format!("more: --cursor {cursor}\n"));
        }
    }

    fn events(&self, events: &[Value]) {
        for event in events {
            if self.json {
                emit(&format!("{}\n", serde_json::to_string(event).unwrap_or_default()));
                continue;
            }
            let data = &event["data"];
            let detail = match event["type"].as_str().unwrap_or_default() {
                "output.appended" => cell(&data["text"], 100),
                "run.started" => format!("attempt {}", text(&data["attempt"])),
                kind if kind.starts_with("approval.") => {
                    format!("{} {} {}", text(&data["id"]), self.status(&data["status"]), cell(&data["action"], 80))
                }
                "run.succeeded" => cell(&data["output"], 100),
                "run.failed" => cell(&data["error"], 100),
                "tool.completed" => format!("{} {}", text(&data["tool"]), text(&data["http_status"])),
                _ => String::new(),
            };
            let line = format!(
                "{:>4}  {}  {:<22} {detail}",
                text(&event["seq"]),
                text(&event["created_at"]),
                text(&event["type"])
            );
            emit(&format!("{}\n", line.trim_end()));
        }
    }
}
