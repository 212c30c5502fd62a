//! The checkpoint of a defined agent: the conversation so far and the calls
//! still to answer; and how a run that continues another carries it on.

use serde::{Deserialize, Serialize};

use super::model::{Message, ToolCall};
use agent_runs_domain::{EventData, PolicyMatch};

/// A tool call the model asked for and that has not been answered yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct PendingCall {
    pub(super) call: ToolCall,
    /// The index in the run's approvals of the one that decides this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) approval: Option<usize>,
    /// An MCP tool's pin when the call was judged: the call is made only
    /// if the server still lists the tool so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) mcp_pin: Option<String>,
    /// For a call made with no approval: the `log_only` rule that matched
    /// it when it was judged (shown on its `tool.completed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) logged: Option<PolicyMatch>,
}

/// The checkpoint: the conversation so far and the calls still to make.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(super) struct Transcript {
    pub(super) messages: Vec<Message>,
    pub(super) model_calls: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) pending: Vec<PendingCall>,
    /// Whether the pending calls were judged (put to the policy and to
    /// people) in the step that asked for them; a checkpoint of an earlier
    /// release has them judged in the next step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) judged: bool,
    /// What was left out of a run's last transcript so that it could be
    /// kept (its final answer took it past the limit): a run continuing it
    /// reports it with what it leaves out itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) dropped: Option<Dropped>,
    /// Where this run's own turn starts (its input): the messages before
    /// are the conversation it continues, which may be left out, oldest
    /// turn first, to make room.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) own_turn: usize,
}

fn is_zero(number: &usize) -> bool {
    *number == 0
}

/// Whole turns left out of a conversation, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(super) struct Dropped {
    pub(super) turns: u64,
    pub(super) bytes: u64,
}

impl Dropped {
    /// The run's record of it: `context.truncated`.
    pub(super) fn event(self) -> EventData {
        EventData::ContextTruncated { dropped_turns: self.turns, dropped_bytes: self.bytes }
    }
}

/// What the answer to a call left unanswered when its run ended says.
const NOT_ANSWERED: &str = "No result: the run ended before this call was answered.";

impl Transcript {
    /// A run's first transcript: its input.
    pub(super) fn new(input: &str) -> Transcript {
        Transcript { messages: vec![Message::User { text: input.to_owned() }], ..Transcript::default() }
    }

    /// The transcript as JSON, and its length.
    pub(super) fn size(&self) -> usize {
        serde_json::to_string(self).map_or(usize::MAX, |json| json.len())
    }

    /// The transcript a run continuing one that ended with `ended` starts
    /// from: every message of it (a call it never answered answered as
    /// such), then `input`. While that is over `max_bytes`, the oldest
    /// whole turns (a user's input and all that followed it) are left out;
    /// the new input's turn always stays.
    pub(super) fn continued(ended: Transcript, input: &str, max_bytes: usize) -> (Transcript, Option<Dropped>) {
        let mut messages = ended.messages;
        for pending in ended.pending {
            messages.push(Message::Tool { call_id: pending.call.id, content: NOT_ANSWERED.into(), is_error: true });
        }
        messages.push(Message::User { text: input.to_owned() });
        let own_turn = messages.len() - 1;
        let mut transcript = Transcript { messages, own_turn, ..Transcript::default() };
        let dropped = transcript.make_room(max_bytes);
        let carried = ended.dropped.unwrap_or_default();
        let total = Dropped { turns: carried.turns + dropped.turns, bytes: carried.bytes + dropped.bytes };
        (transcript, (total.turns > 0).then_some(total))
    }

    /// The transcript a succeeded run keeps: with its final answer, and
    /// within `max_bytes` (the oldest turns of the conversation it continued
    /// left out and counted); `None` when its own turn alone is too large.
    pub(super) fn ended_with(mut self, answer: Option<String>, max_bytes: usize) -> Option<Transcript> {
        self.messages.push(Message::Assistant { text: answer, tool_calls: Vec::new() });
        self.pending.clear();
        self.judged = false;
        // Room for the count itself.
        let room = max_bytes.saturating_sub(64);
        let dropped = self.make_room(room);
        if dropped.turns > 0 {
            let before = self.dropped.unwrap_or_default();
            self.dropped = Some(Dropped { turns: before.turns + dropped.turns, bytes: before.bytes + dropped.bytes });
        }
        (self.size() <= room).then_some(self)
    }

    /// Leaves out the oldest whole turns of the conversation this run
    /// continues (never its own) while the transcript is over `max_bytes`;
    /// what was left out.
    pub(super) fn make_room(&mut self, max_bytes: usize) -> Dropped {
        // A run of its own has nothing before its turn (and is not measured).
        if self.own_turn == 0 {
            return Dropped::default();
        }
        let size = self.size();
        if size <= max_bytes {
            return Dropped::default();
        }
        // Each message's share of the JSON: itself and the comma after it.
        let shares: Vec<usize> = self
            .messages
            .iter()
            .map(|message| serde_json::to_string(message).map_or(0, |json| json.len()) + 1)
            .collect();
        let starts: Vec<usize> = self
            .messages
            .iter()
            .enumerate()
            .take(self.own_turn + 1)
            .filter(|(_, message)| matches!(message, Message::User { .. }))
            .map(|(index, _)| index)
            .collect();
        let (mut cut, mut left, mut turns) = (0, size, 0);
        for &start in starts.iter().skip_while(|start| **start == 0) {
            if left <= max_bytes {
                break;
            }
            left -= shares[cut..start].iter().sum::<usize>();
            cut = start;
            turns += 1;
        }
        // Messages before the first input (none in transcripts this
        // service writes) go with the first turn.
        self.messages.drain(..cut);
        self.own_turn -= cut;
        Dropped { turns, bytes: (size - self.size()) as u64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(input: &str, answer: &str) -> Vec<Message> {
        vec![
            Message::User { text: input.into() },
            Message::Assistant {
                text: None,
                tool_calls: vec![ToolCall { id: format!("c-{input}"), name: "look".into(), arguments: "{}".into() }],
            },
            Message::Tool { call_id: format!("c-{input}"), content: "x".repeat(100), is_error: false },
            Message::Assistant { text: Some(answer.into()), tool_calls: Vec::new() },
        ]
    }

    fn ended(turns: usize) -> Transcript {
        let messages = (0..turns).flat_map(|n| turn(&format!("q{n}"), &format!("a{n}"))).collect();
        Transcript { messages, model_calls: 7, ..Transcript::default() }
    }

    #[test]
    fn a_continuation_carries_every_message_then_the_new_input() {
        let (transcript, dropped) = Transcript::continued(ended(2), "and then?", 1_000_000);
        assert_eq!(dropped, None);
        assert_eq!(transcript.messages.len(), 9);
        assert_eq!(transcript.messages[..8], ended(2).messages[..]);
        assert_eq!(transcript.messages[8], Message::User { text: "and then?".into() });
        // A new run: its own count of model calls.
        assert_eq!(transcript.model_calls, 0);
    }

    #[test]
    fn the_oldest_whole_turns_are_dropped_until_it_fits_and_counted_exactly() {
        let full = Transcript::continued(ended(5), "next", usize::MAX).0;
        let one_turn = Transcript { messages: turn("q0", "a0"), ..Transcript::default() };
        let turn_bytes = one_turn.size() - Transcript::default().size();
        // Room for the new input and two whole earlier turns, not three.
        let limit = full.size() - 2 * turn_bytes - 10;
        let (transcript, dropped) = Transcript::continued(ended(5), "next", limit);
        assert!(transcript.size() <= limit, "{} > {limit}", transcript.size());
        assert_eq!(dropped, Some(Dropped { turns: 3, bytes: (full.size() - transcript.size()) as u64 }));
        assert_eq!(transcript.messages[0], Message::User { text: "q3".into() });
        assert_eq!(transcript.messages.len(), 9);
    }

    #[test]
    fn the_new_input_always_stays_even_when_it_alone_is_too_large() {
        let (transcript, dropped) = Transcript::continued(ended(3), &"y".repeat(5_000), 1_000);
        assert_eq!(transcript.messages, vec![Message::User { text: "y".repeat(5_000) }]);
        assert_eq!(dropped.map(|dropped| dropped.turns), Some(3));
    }

    #[test]
    fn calls_left_unanswered_are_answered_as_such() {
        let mut ended = ended(1);
        let call = ToolCall { id: "c9".into(), name: "deploy".into(), arguments: "{}".into() };
        ended.messages.push(Message::Assistant { text: None, tool_calls: vec![call.clone()] });
        ended.pending.push(PendingCall { call, approval: Some(0), mcp_pin: None, logged: None });
        let (transcript, _) = Transcript::continued(ended, "again", usize::MAX);
        assert_eq!(
            transcript.messages[transcript.messages.len() - 2],
            Message::Tool { call_id: "c9".into(), content: NOT_ANSWERED.into(), is_error: true }
        );
        assert!(transcript.pending.is_empty());
    }

    #[test]
    fn a_kept_transcript_trimmed_to_fit_passes_its_count_to_the_continuation() {
        // A continuation whose own turn is the last of four.
        let continued = Transcript { own_turn: 12, ..ended(4) };
        let kept = continued.clone().ended_with(Some("done".into()), ended(2).size()).expect("its own turn fits");
        let trimmed = kept.dropped.expect("trimmed");
        assert_eq!(kept.own_turn, 0, "the turns before its own left out");
        assert!(trimmed.turns >= 2 && kept.size() <= ended(2).size() + 100);
        assert_eq!(kept.messages.last(), Some(&Message::Assistant { text: Some("done".into()), tool_calls: vec![] }));
        let (_, dropped) = Transcript::continued(kept, "more", usize::MAX);
        assert_eq!(dropped, Some(trimmed));
    }

    #[test]
    fn a_runs_own_turn_is_never_left_out() {
        // A run of its own: nothing before its turn to leave out.
        assert_eq!(ended(3).ended_with(Some("done".into()), 500), None);
        let mut fresh = ended(3);
        assert_eq!(fresh.make_room(500), Dropped::default());
        assert_eq!(fresh, ended(3));
        // A continuation leaves out what came before its input, no more.
        let mut continued = Transcript { own_turn: 8, ..ended(3) };
        let dropped = continued.make_room(10);
        assert_eq!((dropped.turns, continued.own_turn, continued.messages.len()), (2, 0, 4));
        assert_eq!(continued.messages[0], Message::User { text: "q2".into() });
    }
}
