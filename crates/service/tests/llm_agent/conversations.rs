//! Conversations: a run that continues an ended one carries its transcript
//! on, and the model sees the earlier runs' messages, then the new input.

use super::*;

impl Fixture {
    /// A run continuing `previous`'s conversation with `input`, as the
    /// create operation makes it.
    async fn continue_run(&self, previous: &RunMessage, input: &str) -> RunMessage {
        let ended = self.store.get_to_continue(&previous.owner, previous.run_id).await.unwrap().unwrap();
        let id = RunId::from_ulid(self.ids.ulid_at(self.clock.now()));
        let mut run = Run::new(id, previous.owner.clone(), "ops".into(), input.into(), BTreeMap::new(), &self.policy)
            .continuing(&ended);
        self.store.insert(&mut run, None, 1_000).await.unwrap();
        RunMessage { run_id: id, owner: previous.owner.clone() }
    }
}

fn roles_and_texts(messages: &[Value]) -> Vec<(String, String)> {
    messages
        .iter()
        .map(|message| {
            let role = message["role"].as_str().unwrap().to_owned();
            let text = match (&message["content"], &message["tool_calls"]) {
                (Value::String(text), _) => text.clone(),
                (_, Value::Array(calls)) => format!("calls {}", calls[0]["function"]["name"].as_str().unwrap()),
                _ => String::new(),
            };
            (role, text)
        })
        .collect()
}

#[tokio::test]
async fn a_continuation_sees_every_earlier_message_then_its_input_and_forks_share_the_past() {
    let fixture = Fixture::new().await;
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id": "7"}"#),
        text("Ticket 7 is open."),
        text("Closed ticket 7."),
        text("Reopened ticket 7."),
        text("Ticket 7 was closed, then reopened."),
    ]);
    let first = fixture.create("Look up ticket 7").await;
    assert_eq!(fixture.process(&first).await, Outcome::Succeeded);

    let second = fixture.continue_run(&first, "Now close it").await;
    assert_eq!(fixture.process(&second).await, Outcome::Succeeded);
    let seen = roles_and_texts(&messages(&fixture, 2));
    let expected_past = [
        ("system".to_owned(), "You run operations.".to_owned()),
        ("user".into(), "Look up ticket 7".into()),
        ("assistant".into(), "calls lookup".into()),
        ("tool".into(), seen[3].1.clone()),
        ("assistant".into(), "Ticket 7 is open.".into()),
    ];
    assert!(seen[3].1.contains("\"ok\":true"), "the tool's result is carried: {:?}", seen[3]);
    assert_eq!(seen[..5], expected_past[..]);
    assert_eq!(seen[5], ("user".into(), "Now close it".into()));
    assert_eq!(seen.len(), 6, "the system prompt once, then the conversation: {seen:?}");

    // A fork: another run continuing the first sees the first alone.
    let fork = fixture.continue_run(&first, "Reopen it instead").await;
    assert_eq!(fixture.process(&fork).await, Outcome::Succeeded);
    let seen = roles_and_texts(&messages(&fixture, 3));
    assert_eq!(seen[..5], expected_past[..]);
    assert_eq!(seen[5..], [("user".to_owned(), "Reopen it instead".to_owned())]);

    // Three runs deep: the thread is the first run's.
    let third = fixture.continue_run(&second, "What happened?").await;
    assert_eq!(fixture.process(&third).await, Outcome::Succeeded);
    let seen = roles_and_texts(&messages(&fixture, 4));
    let inputs: Vec<&str> = seen.iter().filter(|(role, _)| role == "user").map(|(_, text)| text.as_str()).collect();
    assert_eq!(inputs, ["Look up ticket 7", "Now close it", "What happened?"]);
    assert!(seen.contains(&("assistant".into(), "Closed ticket 7.".into())));
    let run = fixture.run(&third).await;
    assert_eq!((run.thread_id(), run.previous_run_id()), (first.run_id, Some(second.run_id)));
    assert_eq!(fixture.run(&fork).await.thread_id(), first.run_id);
    assert_eq!(fixture.run(&first).await.thread_id(), first.run_id);
    // A run's first step takes the carried transcript up: nothing is
    // carried any more once it saved its own.
    assert!(!run.checkpoint_carried);
    assert!(!events(&fixture, &third).await.iter().any(|(kind, _)| kind == "context.truncated"));
}

#[tokio::test]
async fn a_rejected_call_and_a_call_left_by_a_cancel_reach_the_continuation_as_the_model_saw_them() {
    let fixture = Fixture::new().await;
    let delete = || tool_call("call_9", "delete_branch", r#"{"branch": "old"}"#);
    fixture.stand_in.script(vec![delete(), text("I did not delete it."), text("Understood."), delete(), text("ok")]);
    let first = fixture.create("Delete the branch old").await;
    assert_eq!(fixture.process(&first).await, Outcome::AwaitingApproval);
    fixture.decide(&first, Decision::Reject, Some("not before the release")).await;
    assert_eq!(fixture.process(&first).await, Outcome::Succeeded);

    let second = fixture.continue_run(&first, "Why not?").await;
    assert_eq!(fixture.process(&second).await, Outcome::Succeeded);
    let seen = messages(&fixture, 2);
    let rejection = seen.iter().find(|message| message["role"] == "tool").unwrap();
    assert!(rejection["content"].as_str().unwrap().contains("not before the release"), "{rejection}");

    // Canceled while its call waits: the continuation's model gets an
    // answer to that call (providers refuse a call left unanswered).
    let third = fixture.continue_run(&second, "Delete it now").await;
    assert_eq!(fixture.process(&third).await, Outcome::AwaitingApproval);
    let mut run = fixture.run(&third).await;
    run.cancel(fixture.clock.now()).unwrap();
    fixture.store.update(&mut run).await.unwrap();
    let fourth = fixture.continue_run(&third, "Never mind").await;
    assert_eq!(fixture.process(&fourth).await, Outcome::Succeeded);
    let seen = messages(&fixture, 4);
    let last_call = seen.iter().rposition(|message| message["tool_calls"].is_array()).unwrap();
    assert_eq!(seen[last_call + 1]["role"], "tool");
    assert_eq!(seen[last_call + 1]["tool_call_id"], seen[last_call]["tool_calls"][0]["id"]);
    assert_eq!(seen.last().unwrap()["content"], "Never mind");
    assert_eq!(fixture.stand_in.tool_calls().len(), 0, "no call was made");
}

#[tokio::test]
async fn a_conversation_past_the_limit_drops_its_oldest_turns_and_the_run_records_it() {
    let fixture = Fixture::with(|_| {}, 4_000).await;
    fixture.stand_in.script(vec![text("one"), text("two"), text("three")]);
    let first = fixture.create(&format!("first {}", "a".repeat(1_500))).await;
    assert_eq!(fixture.process(&first).await, Outcome::Succeeded);
    let second = fixture.continue_run(&first, &format!("second {}", "b".repeat(1_500))).await;
    assert_eq!(fixture.process(&second).await, Outcome::Succeeded);
    assert!(!events(&fixture, &second).await.iter().any(|(kind, _)| kind == "context.truncated"), "it fit");

    let third = fixture.continue_run(&second, &format!("third {}", "c".repeat(1_500))).await;
    assert_eq!(fixture.process(&third).await, Outcome::Succeeded);
    let seen = roles_and_texts(&messages(&fixture, 2));
    let inputs: Vec<&str> =
        seen.iter().filter(|(role, _)| role == "user").map(|(_, text)| &text[..text.find(' ').unwrap()]).collect();
    assert_eq!(inputs, ["second", "third"], "the oldest whole turn left out");
    assert!(seen.contains(&("assistant".into(), "two".into())));
    assert!(!seen.contains(&("assistant".into(), "one".into())), "with its answer");
    let truncated: Vec<Value> = events(&fixture, &third)
        .await
        .into_iter()
        .filter(|(kind, _)| kind == "context.truncated")
        .map(|(_, data)| data)
        .collect();
    assert_eq!(truncated.len(), 1);
    assert_eq!(truncated[0]["dropped_turns"], 1);
    // The first turn as JSON: its input, its answer, and their punctuation.
    let dropped = truncated[0]["dropped_bytes"].as_u64().unwrap();
    assert!((1_500..1_600).contains(&dropped), "{dropped}");
    let saved = fixture.store.get_to_continue(&third.owner, third.run_id).await.unwrap().unwrap();
    assert!(saved.checkpoint.unwrap().to_string().len() <= 4_000);
}

#[tokio::test]
async fn a_continuation_whose_own_work_needs_room_leaves_out_the_oldest_turns_rather_than_fail() {
    let fixture = Fixture::with(|_| {}, 16_000).await;
    fixture.stand_in.script(vec![text("noted"), tool_call("call_b", "big", "{}"), text("read it")]);
    let first = fixture.create(&format!("first {}", "a".repeat(6_000))).await;
    assert_eq!(fixture.process(&first).await, Outcome::Succeeded);
    // It fits at the start; the tool's 10,000 bytes then do not.
    let second = fixture.continue_run(&first, "Read the big file").await;
    assert_eq!(fixture.process(&second).await, Outcome::Succeeded, "{:?}", fixture.run(&second).await.error);
    let events = events(&fixture, &second).await;
    let truncated: Vec<&Value> =
        events.iter().filter(|(kind, _)| kind == "context.truncated").map(|(_, data)| data).collect();
    assert_eq!(truncated.len(), 1, "{events:?}");
    assert_eq!(truncated[0]["dropped_turns"], 1);
    let last = roles_and_texts(&messages(&fixture, 2));
    assert_eq!(last[1], ("user".to_owned(), "Read the big file".to_owned()), "the first turn left out");
    // Its own turn is never left out: a run of its own still fails.
    let fresh = Fixture::with(|_| {}, 8_000).await;
    fresh.stand_in.script(vec![tool_call("call_b", "big", "{}")]);
    let alone = fresh.create("Read the big file").await;
    assert_eq!(fresh.process(&alone).await, Outcome::Failed);
    assert!(fresh.run(&alone).await.error.unwrap().contains("grew to"));
}
