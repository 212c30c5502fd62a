//! Plain values a run carries and its events report: where it stands, what
//! it may spend and has spent, which conversation it continues. Apart from
//! `run.rs` so that events, agents and the inbox name them without naming
//! runs (and runs, which name all three, stay above them).

use serde::Serialize;

use crate::ids::RunId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunStatus {
    Queued,
    Running,
    AwaitingApproval,
    Succeeded,
    Failed,
    Canceled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::AwaitingApproval,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Canceled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::AwaitingApproval => "awaiting_approval",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Canceled => "canceled",
        }
    }

    pub fn parse(text: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|status| status.as_str() == text)
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Canceled)
    }
}

/// Where a run that continues another stands in their conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadLink {
    /// The thread's first run.
    pub thread_id: RunId,
    /// The run this one continues.
    pub previous_run_id: RunId,
}

/// What one run may spend; an absent limit is none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub max_total_tokens: Option<u64>,
    pub max_tool_calls: Option<u64>,
}

impl Budget {
    /// Field by field, the tighter of the two.
    pub fn within(self, other: Budget) -> Budget {
        let tighter = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Budget {
            max_total_tokens: tighter(self.max_total_tokens, other.max_total_tokens),
            max_tool_calls: tighter(self.max_tool_calls, other.max_tool_calls),
        }
    }

    /// Why a model call may not be made now, in the words a failed run shows.
    pub fn refuses_model_call(&self, usage: Option<&Usage>) -> Option<String> {
        let used = usage.map_or(0, |usage| usage.total_tokens);
        self.max_total_tokens
            .filter(|max| used >= *max)
            .map(|max| format!("budget exceeded: the run used {used} tokens of its {max}."))
    }

    /// Why a tool call may not be made now (the tokens spent count too: no
    /// paid call follows a turn that went over).
    pub fn refuses_tool_call(&self, usage: Option<&Usage>) -> Option<String> {
        let calls = usage.map_or(0, |usage| usage.tool_calls);
        self.refuses_model_call(usage).or_else(|| {
            self.max_tool_calls
                .filter(|max| calls >= *max)
                .map(|max| format!("budget exceeded: the run made {calls} tool calls of its {max}."))
        })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    /// Tool calls made (each HTTP request to a tool).
    pub tool_calls: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.total_tokens += other.total_tokens;
        self.tool_calls += other.tool_calls;
    }
}
