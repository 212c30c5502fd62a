//! How the client shows what the API answered: tables for people (widths
//! that ignore colour codes, relative times), the API's JSON for scripts.

use serde_json::Value;

use super::emit;

/// How results are shown.
pub(super) struct Output {
    pub(super) json: bool,
    pub(super) colour: bool,
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
    pub(super) fn status(&self, status: &Value) -> String {
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

    pub(super) fn print_json(value: &Value) {
        emit(&format!("{}\n", serde_json::to_string_pretty(value).unwrap_or_default()));
    }

    pub(super) fn run(&self, run: &Value) {
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

    pub(super) fn runs(&self, page: &Value) {
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

    pub(super) fn approvals(&self, page: &Value) {
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

    pub(super) fn events(&self, events: &[Value]) {
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
