//! Runs through the handlers: create, work, approve, cancel, dead letters, the call budget, throttling, a defined agent, the events function.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn create_then_worker_then_get_through_the_handlers() {
    if support::without_emulator("create_then_worker_then_get_through_the_handlers") {
        return;
    }
    let aws = Aws::new().await;
    let (status, run) =
        aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "Summarise"}))).await;
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "queued");
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let (status, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(status, 200);
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["output"], "Summarise");

    // A function serves only its own operation.
    let (status, body) = aws.invoke(Operation::Get, "GET", "/v1/agent/runs", None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn an_approval_and_a_cancel_through_the_handlers() {
    if support::without_emulator("an_approval_and_a_cancel_through_the_handlers") {
        return;
    }
    let aws = Aws::new().await;
    let body = json!({"agent": "script", "input": "say start\napprove Rotate the keys\nsay end"});
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(body)).await;
    aws.deliver().await;
    let (_, waiting) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(waiting["status"], "awaiting_approval");
    let approval = waiting["pending_approvals"][0]["id"].as_str().unwrap();
    let path = format!("/v1/agent/runs/{}/approvals/{approval}", id(&run));
    let (status, decided) = aws.invoke(Operation::Decide, "POST", &path, Some(json!({"decision": "approve"}))).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["status"], "queued");
    let (first_delivery, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["output"], "start\napproved: Rotate the keys\nend");
    // A duplicate delivery of a finished run is acknowledged and changes nothing.
    assert!(aws.run_worker(first_delivery).await.is_empty());
    let (_, again) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(again, done);

    let (_, other) = aws
        .invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"agent": "script", "input": "approve Never"})))
        .await;
    aws.deliver().await;
    let (status, canceled) =
        aws.invoke(Operation::Cancel, "POST", &format!("/v1/agent/runs/{}/cancel", id(&other)), None).await;
    assert_eq!(status, 200);
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["pending_approvals"][0]["status"], "canceled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn unreadable_messages_are_reported_and_runs_that_are_done_are_acknowledged() {
    if support::without_emulator("unreadable_messages_are_reported_and_runs_that_are_done_are_acknowledged") {
        return;
    }
    let aws = Aws::new().await;
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "x"}))).await;
    let (delivered, _) = aws.deliver().await;
    let mut event = sqs_event(vec!["not json".into(), r#"{"run_id": "run_x", "owner": "dev"}"#.into()]);
    event.records.extend(delivered.records.into_iter().map(|mut record| {
        record.message_id = Some("message-duplicate".into());
        record
    }));
    let failures = aws.run_worker(event).await;
    assert_eq!(failures, vec!["message-0".to_owned(), "message-1".to_owned()]);
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&run)), None).await;
    assert_eq!(done["status"], "succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn each_operation_keeps_its_aws_call_budget() {
    if support::without_emulator("each_operation_keeps_its_aws_call_budget") {
        return;
    }
    let aws = Aws::new().await;
    let create = Some(json!({"input": "budget"}));
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create.clone()).await;
    // A place on the owner's count (a single write, apart from the run's
    // transaction, so no two creates conflict), then the run.
    assert_eq!(
        aws.calls.take(),
        ["GetItem", "UpdateItem", "TransactWriteItems", "SendMessage"],
        "cold: one key lookup"
    );

    aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create.clone()).await;
    assert_eq!(aws.calls.take(), ["UpdateItem", "TransactWriteItems", "SendMessage"], "warm: no key lookup");

    let get = format!("/v1/agent/runs/{}", id(&run));
    aws.invoke(Operation::Get, "GET", &get, None).await;
    assert_eq!(aws.calls.take(), ["GetItem"]);

    // A list reads each shard of the owner's entries at once (a shard is
    // read on only while it could hold more of the page), then the runs.
    let shards = agent_runs_aws::OWNER_SHARDS as usize;
    aws.invoke(Operation::List, "GET", "/v1/agent/runs?limit=20", None).await;
    let calls = aws.calls.take();
    assert_eq!(calls.iter().filter(|call| *call == "Query").count(), shards, "{calls:?}");
    assert_eq!(calls.iter().filter(|call| *call != "Query").collect::<Vec<_>>(), ["BatchGetItem"]);
    // The status index holds the runs themselves.
    aws.invoke(Operation::List, "GET", "/v1/agent/runs?status=queued&limit=1", None).await;
    assert_eq!(aws.calls.take(), vec!["Query"; shards]);
    aws.invoke(Operation::Events, "GET", &format!("{get}/events"), None).await;
    assert_eq!(aws.calls.take(), ["GetItem", "Query"], "the run (whose owner it must be), then its log");

    // The idempotency record is written in the same transaction as the run.
    let mut event: Value = serde_json::from_str(include_str!("../fixtures/apigw-v2-create-run.json")).unwrap();
    event["headers"]["authorization"] = format!("Bearer {}", aws.key).into();
    event["headers"]["idempotency-key"] = "budget-1".into();
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.status(), 201);
    assert_eq!(aws.calls.take(), ["UpdateItem", "TransactWriteItems", "SendMessage"]);
    // A replay gives back the place it took, reads the record and the run. The run is not claimed yet, so
    // the first request could still undo it: the replay pins it with a
    // write (which that undo refuses) and sends it again.
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let (place, give_back) = ("UpdateItem", "UpdateItem");
    assert_eq!(
        aws.calls.take(),
        [place, "TransactWriteItems", give_back, "GetItem", "GetItem", "PutItem", "SendMessage"]
    );
    // Once pinned, a replay only reads (and takes a place and gives it back).
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = aws.api.handle_as(Some(Operation::Create), into_api_request(request)).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    assert_eq!(aws.calls.take(), [place, "TransactWriteItems", give_back, "GetItem", "GetItem"]);

    let cancel = format!("/v1/agent/runs/{}/cancel", id(&run));
    aws.invoke(Operation::Cancel, "POST", &cancel, None).await;
    assert_eq!(aws.calls.take(), ["GetItem", "TransactWriteItems", give_back], "read, the terminal write, the count");

    // The worker, per echo run: a read, then the terminal write, which
    // carries the claim (echo ends at its first step), and the giving back
    // of its place on the count; the canceled run's message costs one read
    // and is dropped, and so does the replay's second message for the
    // pinned run (or, should the two meet in one batch: a read, an end that
    // loses, the check that the run ended all the same, a read and a
    // giving back that changes nothing, and two reads that find it ended:
    // the write's and the worker's, which would claim a queued run again).
    let (_, failures) = aws.deliver().await;
    assert!(failures.is_empty());
    let worker_calls = aws.calls.take();
    let echo_runs = aws.invoke(Operation::List, "GET", "/v1/agent/runs?status=succeeded", None).await.1["data"]
        .as_array()
        .unwrap()
        .len();
    aws.calls.take();
    assert_eq!(echo_runs, 2);
    assert!((3 * echo_runs + 2..=3 * echo_runs + 7).contains(&worker_calls.len()), "{worker_calls:?}");
    // One transaction per run (the run and its events); an end that loses
    // to the other message's is one more.
    let transactions = worker_calls.iter().filter(|call| *call == "TransactWriteItems").count();
    assert!((echo_runs..=echo_runs + 1).contains(&transactions), "{worker_calls:?}");
    assert!(!worker_calls.iter().any(|call| call == "PutItem"), "{worker_calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn dead_lettered_runs_are_failed_unless_they_moved_on() {
    if support::without_emulator("dead_lettered_runs_are_failed_unless_they_moved_on") {
        return;
    }
    let aws = Aws::new().await;
    let (_, stuck) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "stuck"}))).await;
    let (_, done) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "done"}))).await;
    // The first message is lost to the dead-letter queue; the second is worked.
    let received = aws
        .sqs
        .receive_message()
        .queue_url(&aws.queue_url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    for message in received.messages.unwrap_or_default() {
        aws.sqs
            .delete_message()
            .queue_url(&aws.queue_url)
            .receipt_handle(message.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }
    let message = |run: &Value| json!({"run_id": id(run), "owner": "dev"}).to_string();
    aws.run_worker(sqs_event(vec![message(&done)])).await;

    let event = sqs_event(vec![message(&stuck), message(&done), "not json".into()]);
    let response = handle_dead_letters(&aws.services.store, aws.services.services.clock.as_ref(), event).await;
    assert!(response.batch_item_failures.is_empty());
    let (_, failed) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&stuck)), None).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"].as_str().unwrap().contains("queue message"), "{failed}");
    let (_, succeeded) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&done)), None).await;
    assert_eq!(succeeded["status"], "succeeded", "a run that moved on is left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn dynamodb_throttling_is_retried_then_answered_503_and_nothing_is_lost() {
    if support::without_emulator("dynamodb_throttling_is_retried_then_answered_503_and_nothing_is_lost") {
        return;
    }
    let throttling = RandomFailures::new(0.0, 1);
    let aws = Aws::with_faults(throttling.clone(), AwsError::Throttling).await;
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(json!({"input": "kept"}))).await;
    let path = format!("/v1/agent/runs/{}", id(&run));
    aws.calls.take();

    throttling.set_share(1.0);
    for (operation, method, path, body) in [
        (Operation::Get, "GET", path.clone(), None),
        (Operation::List, "GET", "/v1/agent/runs".to_owned(), None),
        (Operation::Create, "POST", "/v1/agent/runs".to_owned(), Some(json!({"input": "refused"}))),
        (Operation::Cancel, "POST", format!("{path}/cancel"), None),
    ] {
        let (status, body) = aws.invoke(operation, method, &path, body).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "unavailable");
        assert!(!body.to_string().contains("Throttling"), "no internals: {body}");
    }
    let calls = aws.calls.take();
    assert!(calls.iter().filter(|call| *call == "GetItem").count() >= 2 * 3, "the SDK retried: {calls:?}");
    assert!(throttling.injected.load(std::sync::atomic::Ordering::SeqCst) >= 12);

    throttling.set_share(0.0);
    let (status, after) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!((status, after["status"].as_str()), (200, Some("queued")), "the run accepted before is still there");
    // The throttled create's first write, its place on the owner's count,
    // reached the table before its answer was replaced: like a timeout, a 503
    // leaves that outcome unknown, so the place stays taken (never a run
    // without one) and the run was not written. The recount gives the place
    // back once the create is surely over.
    let (_, listed) = aws.invoke(Operation::List, "GET", "/v1/agent/runs", None).await;
    let statuses: Vec<&str> =
        listed["data"].as_array().unwrap().iter().map(|run| run["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["queued"]);
    assert_eq!(aws.active_runs().await, 2, "the run's place and the refused create's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_defined_agent_waits_for_approval_and_calls_its_tool_exactly_once() {
    if support::without_emulator("a_defined_agent_waits_for_approval_and_calls_its_tool_exactly_once") {
        return;
    }
    let aws = Aws::new().await;
    let model = stand_in::StandIn::start().await;
    aws.define(janitor(&model.url)).await;
    model.script(vec![
        stand_in::tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#),
        stand_in::text("Deleted old."),
    ]);
    // A rule tried in log_only mode: recorded on the approval a person decides.
    let rules =
        json!({"rules": [{"id": "old-branches", "tool": "delete_branch", "effect": "allow", "mode": "log_only"}]});
    let (status, put) = aws.invoke(Operation::PutPolicy, "PUT", "/v1/policies", Some(rules)).await;
    assert_eq!((status, put["version"].as_u64()), (200, Some(1)), "{put}");

    let body = json!({"agent": "janitor", "input": "Delete the branch old"});
    let (status, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(body)).await;
    assert_eq!(status, 201, "{run}");
    let path = format!("/v1/agent/runs/{}", id(&run));
    // The first message, delivered twice in one batch: one worker parks the run.
    let first = aws.receive().await;
    assert!(aws.run_worker(sqs_event([first.clone(), first].concat())).await.is_empty());
    let (_, waiting) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!(waiting["status"], "awaiting_approval", "{waiting}");
    assert_eq!(waiting["pending_approvals"][0]["action"], r#"Call the tool `delete_branch` with {"branch":"old"}"#);
    assert_eq!(
        waiting["pending_approvals"][0]["policy"],
        json!({"rule": "old-branches", "effect": "allow", "mode": "log_only", "version": 1})
    );
    assert_eq!(waiting["usage"], json!({"input_tokens": 10, "output_tokens": 5, "total_tokens": 15, "tool_calls": 0}));
    assert!(model.tool_calls().is_empty());

    let approval = waiting["pending_approvals"][0]["id"].as_str().unwrap();
    let decide = format!("{path}/approvals/{approval}");
    let (status, _) = aws.invoke(Operation::Decide, "POST", &decide, Some(json!({"decision": "approve"}))).await;
    assert_eq!(status, 200);
    // The resumed run's message, delivered twice at once and once more later.
    let resumed = aws.receive().await;
    assert!(aws.run_worker(sqs_event([resumed.clone(), resumed.clone()].concat())).await.is_empty());
    assert!(aws.run_worker(sqs_event(resumed)).await.is_empty());

    let (_, done) = aws.invoke(Operation::Get, "GET", &path, None).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["output"], "Deleted old.");
    assert_eq!(done["usage"], json!({"input_tokens": 20, "output_tokens": 10, "total_tokens": 30, "tool_calls": 1}));
    let calls = model.tool_calls();
    assert_eq!(calls.len(), 1, "the approved tool ran exactly once: {calls:?}");
    assert_eq!(calls[0].idempotency_key, Some(format!("{}/call_1", id(&run))));
    assert_eq!(model.model_requests().len(), 2);
}

/// The events function: the log in pages, `wait` woken by a write (here by
/// polling), a run that has ended answered at once, `Accept:
/// text/event-stream` answered in JSON (API Gateway cannot stream), and
/// bad input refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn the_events_function_answers_the_log_in_pages_and_waits_for_more() {
    if support::without_emulator("the_events_function_answers_the_log_in_pages_and_waits_for_more") {
        return;
    }
    let aws = Aws::new().await;
    let create = Some(json!({"agent": "script", "input": "say one\nsay two"}));
    let (_, run) = aws.invoke(Operation::Create, "POST", "/v1/agent/runs", create).await;
    let path = format!("/v1/agent/runs/{}/events", id(&run));
    let types = |page: &Value| -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|event| event["type"].as_str().unwrap().to_owned()).collect()
    };
    let (status, page) = aws.invoke(Operation::Events, "GET", &path, None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(types(&page), ["run.created"]);
    assert_eq!((page["next_after"].as_u64(), page["has_more"].as_bool()), (Some(1), Some(false)));
    assert_eq!(page["data"][0]["run_id"], run["id"]);
    assert_eq!(page["data"][0]["data"], run, "run.created shows the run as created");

    // Someone waits for what comes after run.created while the worker runs it.
    let after_created = format!("{path}?after=1&wait=15");
    let waiting = aws.invoke(Operation::Events, "GET", &after_created, None);
    let working = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        aws.deliver().await
    };
    let ((status, woken), _) = tokio::join!(waiting, working);
    assert_eq!(status, 200);
    assert_eq!(types(&woken).first().map(String::as_str), Some("run.started"), "{woken}");

    let (_, page) = aws.invoke(Operation::Events, "GET", &format!("{path}?after=1&limit=2"), None).await;
    assert_eq!(types(&page), ["run.started", "output.appended"]);
    assert_eq!((page["next_after"].as_u64(), page["has_more"].as_bool()), (Some(3), Some(true)));
    assert_eq!(page["data"][1]["data"], json!({"text": "one", "truncated": false}));
    let accept = [("accept", "text/event-stream")];
    let (_, rest) = aws.invoke_with(Operation::Events, "GET", &format!("{path}?after=3"), None, &accept).await;
    assert_eq!(types(&rest), ["output.appended", "run.succeeded"], "JSON, not a stream");
    assert_eq!(rest["data"][1]["data"]["output"], "one\ntwo");
    assert!(rest["data"][1]["id"].as_str().unwrap().starts_with("evt_"));

    // The run has ended: nothing more will come, so a wait is not held.
    let started = std::time::Instant::now();
    let (_, end) = aws.invoke(Operation::Events, "GET", &format!("{path}?after=5&wait=20"), None).await;
    assert_eq!((end["data"].as_array().map(Vec::len), end["next_after"].as_u64()), (Some(0), Some(5)));
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "answered without waiting out the 20 s");

    for (query, param) in [
        ("after=-1", "after"),
        ("after=7", "after"),
        ("after=x", "after"),
        ("wait=21", "wait"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("since=1", "since"),
    ] {
        let (status, error) = aws.invoke(Operation::Events, "GET", &format!("{path}?{query}"), None).await;
        assert_eq!((status, error["error"]["param"].as_str()), (400, Some(param)), "{query}: {error}");
    }
    let unknown = format!("/v1/agent/runs/run_{}/events", ulid::Ulid::new());
    assert_eq!(aws.invoke(Operation::Events, "GET", &unknown, None).await.0, 404);
}

/// A continuation costs one read more than a run started afresh: its create
/// reads the run it continues with the state that run ended with (one
/// `BatchGetItem`), and its first step finds that state in its own run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn a_continued_run_costs_one_read_more_than_a_fresh_one() {
    if support::without_emulator("a_continued_run_costs_one_read_more_than_a_fresh_one") {
        return;
    }
    let aws = Aws::new().await;
    let model = stand_in::StandIn::start().await;
    aws.define(json!({
        "name": "talker", "provider": "openai", "model": "stand-in-1", "base_url": format!("{}/v1", model.url),
        "system_prompt": "You talk.", "allow_private_network": true
    }))
    .await;
    model.script(vec![stand_in::text("one"), stand_in::text("two"), stand_in::text("three")]);
    let create = |input: &str, previous: Option<&Value>| {
        let mut body = json!({"agent": "talker", "input": input});
        if let Some(previous) = previous {
            body = json!({"input": input, "previous_run_id": id(previous)});
        }
        aws.invoke(Operation::Create, "POST", "/v1/agent/runs", Some(body))
    };
    // Warm: the key and the agent's name known.
    let (_, warm) = create("warm up", None).await;
    aws.deliver().await;
    aws.calls.take();

    let (_, first) = create("Hello", None).await;
    let fresh_create = aws.calls.take();
    aws.deliver().await;
    let fresh_work = aws.calls.take();
    let (_, second) = create("And then?", Some(&first)).await;
    assert_eq!(second["previous_run_id"], first["id"], "{second}");
    let continued_create = aws.calls.take();
    aws.deliver().await;
    let continued_work = aws.calls.take();

    assert_eq!(continued_create[0], "BatchGetItem", "the run continued and its transcript: {continued_create:?}");
    assert_eq!(continued_create[1..], fresh_create[..], "then a create as any other");
    assert_eq!(continued_work, fresh_work, "its first step reads nothing more");
    let (_, done) = aws.invoke(Operation::Get, "GET", &format!("/v1/agent/runs/{}", id(&second)), None).await;
    assert_eq!(done["output"], "three");
    let seen = &model.model_requests()[2]["messages"];
    assert_eq!(seen.as_array().unwrap().len(), 4, "system, Hello, two, And then?: {seen}");
    assert_eq!(seen[2]["content"], "two");
    assert_ne!(id(&warm), id(&first));
}
