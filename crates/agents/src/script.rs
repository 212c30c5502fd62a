//! The `script` agent: a deterministic agent for tests and demos. Its input
//! is lines of commands: `say <text>`, `sleep <ms>`, `approve <action>`,
//! `ask <question>`, `fail <message>`; blank lines are ignored.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{Agent, Step, StepInput};
use agent_runs_domain::{
    ApprovalRequest, ApprovalStatus, EventData, MAX_QUESTION_CHARS, answer_text, default_input_schema,
};

pub const MAX_SLEEP_MS: u64 = 60_000;
/// A long sleep is taken in slices so a cancel is noticed between them.
const SLEEP_SLICE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Command<'a> {
    Say(&'a str),
    Sleep(u64),
    Approve(&'a str),
    Ask(&'a str),
    Fail(&'a str),
}

/// One line: a command, `None` for a blank line, or what is wrong with it.
fn parse_line(raw: &str, line_number: usize) -> Result<Option<Command<'_>>, String> {
    let line = raw.strip_suffix('\r').unwrap_or(raw);
    if line.trim().is_empty() {
        return Ok(None);
    }
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    let command = match word {
        "say" => Command::Say(rest),
        "sleep" => {
            let ms = rest
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= MAX_SLEEP_MS && rest.trim().bytes().all(|b| b.is_ascii_digit()));
            Command::Sleep(ms.ok_or_else(|| {
                format!("line {line_number}: `sleep` takes a whole number of milliseconds from 0 to {MAX_SLEEP_MS}.")
            })?)
        }
        "approve" if !rest.trim().is_empty() => Command::Approve(rest),
        "approve" => {
            return Err(format!("line {line_number}: `approve` needs the action to approve."));
        }
        "ask" if !rest.trim().is_empty() => Command::Ask(rest),
        "ask" => return Err(format!("line {line_number}: `ask` needs the question to ask.")),
        "fail" => Command::Fail(rest),
        other => {
            let shown: String = other.chars().take(40).collect();
            return Err(format!(
                "line {line_number}: unknown command `{shown}`; the script agent knows say, sleep, approve, ask and fail."
            ));
        }
    };
    Ok(Some(command))
}

/// The commands of a script in order, each with the byte offset at which
/// the line after it starts.
fn commands(input: &str) -> impl Iterator<Item = Result<(Command<'_>, usize), String>> {
    let mut offset = 0;
    input.split('\n').enumerate().filter_map(move |(index, raw)| {
        offset = (offset + raw.len() + 1).min(input.len());
        parse_line(raw, index + 1).map(|command| command.map(|command| (command, offset))).transpose()
    })
}

fn parse(input: &str) -> Result<Vec<Command<'_>>, String> {
    commands(input).map(|command| command.map(|(command, _)| command)).collect()
}

/// Where the script is: the next command, the output so far, and what is
/// left of a sleep or which approval it waits for.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Progress {
    next: usize,
    /// Where in the input the next command's line starts, so a step parses
    /// one line, not the whole script; `None` in checkpoints from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    offset: Option<usize>,
    lines: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sleep_left_ms: Option<u64>,
    /// The index in the run's approvals of the one this script asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    awaiting: Option<usize>,
}

pub struct ScriptAgent;

impl ScriptAgent {
    fn next(progress: Progress) -> Step {
        Step::Continue(serde_json::to_value(progress).unwrap_or_default())
    }
}

#[async_trait]
impl Agent for ScriptAgent {
    /// Checked as a run is created (a run created before a limit existed
    /// still resumes).
    fn validate_input(&self, input: &str) -> Result<(), String> {
        parse(input)?;
        for (index, raw) in input.split('\n').enumerate() {
            if let Ok(Some(Command::Ask(question))) = parse_line(raw, index + 1)
                && question.chars().count() > MAX_QUESTION_CHARS
            {
                return Err(format!(
                    "line {}: `ask` takes a question of at most {MAX_QUESTION_CHARS} characters, as `ask_human` does.",
                    index + 1
                ));
            }
        }
        Ok(())
    }

    fn description(&self) -> Option<&'static str> {
        Some("Follows the script of steps its input is (say, sleep, approve, ask, fail): for tests and demos.")
    }

    async fn step(&self, step: StepInput<'_>) -> Step {
        let mut progress: Progress = match step.checkpoint.map(|value| serde_json::from_value(value.clone())) {
            None => Progress::default(),
            Some(Ok(progress)) => progress,
            Some(Err(_)) => {
                return Step::Failed("The script agent could not resume from its checkpoint.".into());
            }
        };
        let from = progress.offset.unwrap_or_else(|| {
            let done = commands(step.input).take(progress.next).filter_map(Result::ok).last();
            done.map_or(0, |(_, end)| end)
        });
        let current = match step.input.get(from..).map(|rest| commands(rest).next()) {
            None => return Step::Failed("The script agent could not resume from its checkpoint.".into()),
            Some(None) => None,
            Some(Some(Ok((command, length)))) => Some((command, from + length)),
            Some(Some(Err(message))) => return Step::Failed(message),
        };

        if let Some(index) = progress.awaiting.take() {
            let (Some(approval), Some((_, end))) = (step.approvals.get(index), current) else {
                return Step::Failed("The approval the script waited for is missing.".into());
            };
            let line = match (approval.status, &approval.answer) {
                (ApprovalStatus::Approved, _) => format!("approved: {}", approval.action),
                (ApprovalStatus::Answered, Some(answer)) => format!("answered: {}", answer_text(answer)),
                (ApprovalStatus::Rejected, _) if approval.input_schema.is_some() => {
                    format!("declined: {}", approval.action)
                }
                (ApprovalStatus::Rejected, _) => format!("rejected: {}", approval.action),
                _ => {
                    return Step::Failed("The approval the script waited for was not decided.".into());
                }
            };
            step.events.push(EventData::output(&line));
            progress.lines.push(line);
            progress.next += 1;
            progress.offset = Some(end);
            return Self::next(progress);
        }

        let Some((command, end)) = current else {
            return Step::succeeded(progress.lines.join("\n"));
        };
        progress.offset = Some(from);
        match command {
            Command::Say(text) => {
                step.events.push(EventData::output(text));
                progress.lines.push(text.to_owned());
                progress.next += 1;
                progress.offset = Some(end);
            }
            Command::Sleep(ms) => {
                let left = Duration::from_millis(progress.sleep_left_ms.unwrap_or(ms));
                let slice = left.min(SLEEP_SLICE);
                tokio::time::sleep(slice).await;
                let left = left - slice;
                if left.is_zero() {
                    progress.sleep_left_ms = None;
                    progress.next += 1;
                    progress.offset = Some(end);
                } else {
                    progress.sleep_left_ms = Some(left.as_millis() as u64);
                }
            }
            Command::Approve(action) => {
                progress.awaiting = Some(step.approvals.len());
                return Step::AwaitApproval {
                    requests: vec![ApprovalRequest::action(action)],
                    checkpoint: serde_json::to_value(progress).unwrap_or_default(),
                };
            }
            Command::Ask(question) => {
                progress.awaiting = Some(step.approvals.len());
                return Step::AwaitApproval {
                    requests: vec![ApprovalRequest::question(question, default_input_schema())],
                    checkpoint: serde_json::to_value(progress).unwrap_or_default(),
                };
            }
            Command::Fail(message) => return Step::Failed(message.to_owned()),
        }
        Self::next(progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_command_and_ignores_blank_lines() {
        let commands =
            parse("say hello world\n\n  \nsleep 10\r\napprove Delete 3 branches\nask Which env?\nfail boom").unwrap();
        assert_eq!(
            commands,
            vec![
                Command::Say("hello world"),
                Command::Sleep(10),
                Command::Approve("Delete 3 branches"),
                Command::Ask("Which env?"),
                Command::Fail("boom")
            ]
        );
    }

    #[test]
    fn rejects_unknown_commands_and_bad_arguments_with_the_line() {
        assert!(parse("say hi\nshout hi").unwrap_err().starts_with("line 2: unknown command `shout`"));
        assert!(parse("sleep 60001").unwrap_err().contains("0 to 60000"));
        assert!(parse("sleep -1").is_err());
        assert!(parse("sleep +5").is_err());
        assert!(parse("sleep").is_err());
        assert!(parse("approve").is_err());
        assert!(parse("ask  ").unwrap_err().contains("question"));
        let long = format!("say hi\nask {}", "?".repeat(MAX_QUESTION_CHARS + 1));
        assert!(parse(&long).is_ok(), "a run created before the limit still resumes");
        let refused = ScriptAgent.validate_input(&long).unwrap_err();
        assert!(refused.contains("line 2: `ask` takes a question of at most 2000 characters"), "{refused}");
        assert!(ScriptAgent.validate_input(&format!("ask {}", "?".repeat(MAX_QUESTION_CHARS))).is_ok());
        assert!(parse("SAY hi").is_err());
        assert_eq!(parse("sleep 60000").unwrap(), vec![Command::Sleep(60_000)]);
    }
}
