//! The command line client (`agent-runs runs …`, `agent-runs approvals …`)
//! as a process, against `agent-runs serve`.

mod support;

use std::process::{Command, Output};

use serde_json::Value;
use support::{BIN, Server, Target};

/// Runs the client with `key` against `url`.
fn cli_at(url: &str, key: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).env("AGENT_RUNS_URL", url).env_remove("AGENT_RUNS_KEY");
    if let Some(key) = key {
        command.env("AGENT_RUNS_KEY", key);
    }
    command.output().expect("the binary runs")
}

fn cli(server: &Server, args: &[&str]) -> Output {
    cli_at(&server.base, server.dev_key.as_deref(), args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs the client, expects success, and reads its `--json` answer.
fn json(server: &Server, args: &[&str]) -> Value {
    let output = cli(server, &[args, &["--json"]].concat());
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    serde_json::from_str(&stdout(&output)).unwrap_or_else(|_| panic!("{args:?}: JSON: {}", stdout(&output)))
}

#[test]
fn a_person_creates_finds_approves_and_watches_a_run() {
    let server = Server::start_on(Target::Embedded, &[]);
    let script = "say hi\napprove Deploy <b>v2</b>\nsay done";
    let run = json(&server, &["runs", "create", "--agent", "script", "--input", script, "--metadata", "ticket=OPS-1"]);
    let id = run["id"].as_str().unwrap().to_owned();
    assert_eq!((&run["status"], &run["metadata"]["ticket"]), (&Value::from("queued"), &Value::from("OPS-1")));
    server.wait_for_status(server.dev_key.as_ref().unwrap(), &id, "awaiting_approval");

    let inbox = json(&server, &["approvals", "list"]);
    assert_eq!(inbox["data"][0]["run_id"], id.as_str());
    let table = cli(&server, &["approvals", "list"]);
    assert!(table.status.success());
    let shown = stdout(&table);
    assert!(shown.starts_with("RUN") && shown.contains(&id) && shown.contains("pending"), "{shown}");
    assert!(shown.contains("Deploy <b>v2</b>"), "{shown}");
    assert!(!shown.contains('\x1b'), "no colour when stdout is not a terminal");
    // How long it has waited, not two timestamps.
    let header: Vec<&str> = shown.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["RUN", "APPROVAL", "STATUS", "AGENT", "WAITING", "ACTION"]);
    let waited = shown.lines().nth(1).unwrap().split_whitespace().nth(4).unwrap().to_owned();
    assert!(waited.ends_with('s') && waited[..waited.len() - 1].parse::<u32>().is_ok(), "{shown}");

    let approved = cli(&server, &["runs", "approve", &id, "--comment", "ok"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    assert!(stdout(&approved).contains("approved"), "{}", stdout(&approved));
    // Who decided and what they said are shown with the approval.
    let comment = stdout(&approved).lines().find(|line| line.trim_start().starts_with("comment")).map(str::to_owned);
    assert_eq!(
        comment.as_deref().map(str::split_whitespace).map(Iterator::collect::<Vec<_>>),
        Some(vec!["comment", "ok"])
    );
    assert!(stdout(&approved).contains("decided by  key_"), "{}", stdout(&approved));

    let watched = cli(&server, &["runs", "watch", &id]);
    assert_eq!(watched.status.code(), Some(0), "{}", stderr(&watched));
    let log = stdout(&watched);
    for expected in ["run.created", "approval.decided", "hi", "run.succeeded"] {
        assert!(log.contains(expected), "{expected} in {log}");
    }
    let done = json(&server, &["runs", "get", &id]);
    assert_eq!(done["output"], "hi\napproved: Deploy <b>v2</b>\ndone");
    let succeeded = json(&server, &["runs", "list", "--status", "succeeded", "--limit", "5"]);
    assert_eq!(succeeded["data"][0]["id"], id.as_str());
    let events = cli(&server, &["runs", "events", &id, "--json"]);
    let lines: Vec<Value> = stdout(&events).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.first().unwrap()["type"], "run.created");
    assert_eq!(lines.last().unwrap()["type"], "run.succeeded");
}

#[test]
fn watch_exits_non_zero_for_runs_that_fail_or_are_canceled_and_rejections_go_through() {
    let server = Server::start_on(Target::Embedded, &[]);
    let key = server.dev_key.clone().unwrap();
    let failing = json(&server, &["runs", "create", "--agent", "script", "--input", "fail boom"]);
    assert_eq!(cli(&server, &["runs", "watch", failing["id"].as_str().unwrap()]).status.code(), Some(1));

    let slow = json(&server, &["runs", "create", "--agent", "script", "--input", "sleep 60000"]);
    let slow_id = slow["id"].as_str().unwrap();
    let canceled = json(&server, &["runs", "cancel", slow_id]);
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(cli(&server, &["runs", "watch", slow_id]).status.code(), Some(1));

    let asking = json(&server, &["runs", "create", "--agent", "script", "--input", "approve Send it"]);
    let asking_id = asking["id"].as_str().unwrap();
    server.wait_for_status(&key, asking_id, "awaiting_approval");
    // A decision bound to another call's digest changes nothing.
    let stale = cli(&server, &["runs", "approve", asking_id, "--sha256", &"0".repeat(64)]);
    assert_eq!(stale.status.code(), Some(2));
    assert!(stderr(&stale).contains("HTTP 409"), "{}", stderr(&stale));
    let rejected = json(&server, &["runs", "reject", asking_id, "--comment", "not today"]);
    assert_eq!(rejected["pending_approvals"][0]["comment"], "not today");
    assert_eq!(cli(&server, &["runs", "watch", asking_id]).status.code(), Some(0));
    let again = cli(&server, &["runs", "approve", asking_id]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("has no pending approval"), "{}", stderr(&again));
}

#[test]
fn errors_say_what_went_wrong_and_exit_non_zero() {
    let server = Server::start_on(Target::Embedded, &[]);
    let unknown = cli(&server, &["runs", "get", "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9"]);
    assert_eq!(unknown.status.code(), Some(2), "an error is 2; 1 is a run that did not succeed");
    let said = stderr(&unknown);
    assert!(said.contains("No run with that id") && said.contains("(HTTP 404, not_found)"), "{said}");
    assert!(!said.contains("panicked"), "{said}");

    let bad_input = cli(&server, &["runs", "create", "--agent", "script", "--input", "shout"]);
    assert!(!bad_input.status.success() && stderr(&bad_input).contains("HTTP 400"), "{}", stderr(&bad_input));
    let bad_edit = cli(&server, &["runs", "approve", "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9", "apr_x", "--edit", "{nope"]);
    assert!(stderr(&bad_edit).contains("--edit is not JSON"), "{}", stderr(&bad_edit));

    let unreachable = cli_at("http://127.0.0.1:9", Some("ark_x"), &["runs", "list"]);
    assert_eq!(unreachable.status.code(), Some(2));
    assert!(stderr(&unreachable).contains("cannot reach http://127.0.0.1:9/v1/agent/runs"), "{}", stderr(&unreachable));
    let keyless = cli_at(&server.base, None, &["runs", "list"]);
    assert!(!keyless.status.success() && stderr(&keyless).contains("AGENT_RUNS_KEY"), "{}", stderr(&keyless));
    let wrong_key = cli_at(&server.base, Some("ark_wrong"), &["approvals", "list"]);
    assert!(stderr(&wrong_key).contains("HTTP 401"), "{}", stderr(&wrong_key));
}

/// `agent-runs aws-migrate` on a table of the current layout moves nothing;
/// on a table that is not there it says so, with the service's reason.
#[test]
fn aws_migrate_moves_nothing_on_a_current_table_and_names_a_missing_one() {
    if support::without_emulator("aws_migrate_moves_nothing_on_a_current_table_and_names_a_missing_one") {
        return;
    }
    let resources = support::create_aws_resources();
    let table = &resources.iter().find(|(name, _)| name == "AGENT_RUNS_TABLE").expect("aws-setup names the table").1;
    let migrate = |table: &str| {
        Command::new(BIN)
            .args(["aws-migrate", "--table", table])
            .envs(support::aws_env())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the binary runs")
    };
    let current = migrate(table);
    assert!(current.status.success(), "{}", stderr(&current));
    assert!(stdout(&current).starts_with("moved 0 runs and 0 idempotency records"), "{}", stdout(&current));
    let missing = migrate("no-such-table");
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("ResourceNotFoundException"), "{}", stderr(&missing));
}

#[test]
fn policies_are_tested_put_and_shown_from_the_command_line() {
    let server = Server::start_on(Target::Embedded, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.json");
    std::fs::write(
        &file,
        r#"{"rules": [{"id": "protect-main", "tool": "delete_branch", "effect": "deny", "reason": "main is protected",
            "when": [{"path": "/branch", "op": "==", "value": "main"}]}]}"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let default = stdout(&cli(&server, &["policies", "get"]));
    assert!(default.starts_with("version 0  (the default: never set)\n"), "{default}");
    let tested = cli(&server, &["policies", "test", "--file", file, "--limit", "50"]);
    assert!(tested.status.success(), "{}", stderr(&tested));
    let table = stdout(&tested);
    assert!(table.starts_with("0 decisions replayed: 0 would be allowed, 0 denied, 0 still asked"), "{table}");
    assert!(table.lines().any(|line| line.split_whitespace().eq(["protect-main", "0", "0", "0"])), "{table}");

    let put = json(&server, &["policies", "put", "--file", file, "--if-match", "0"]);
    assert_eq!((&put["version"], &put["rules"][0]["id"]), (&Value::from(1), &Value::from("protect-main")));
    let stale = cli(&server, &["policies", "put", "--file", file, "--if-match", "0"]);
    assert_eq!(stale.status.code(), Some(2));
    assert!(stderr(&stale).contains("HTTP 412"), "{}", stderr(&stale));
    let shown = stdout(&cli(&server, &["policies", "get"]));
    assert!(shown.starts_with("version 1"), "{shown}");
    assert!(shown.contains("protect-main") && shown.contains("/branch == \"main\""), "{shown}");
}

#[test]
fn a_person_answers_questions_as_text_and_as_json() {
    let server = Server::start_on(Target::Embedded, &[]);
    let key = server.dev_key.clone().unwrap();
    let run =
        json(&server, &["runs", "create", "--agent", "script", "--input", "ask Which env?\nask How many?\nsay done"]);
    let id = run["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &id, "awaiting_approval");
    let questions = json(&server, &["approvals", "list", "--kind", "input"]);
    assert_eq!(questions["data"][0]["action"], "Which env?");
    assert!(json(&server, &["approvals", "list", "--kind", "tool_call"])["data"].as_array().unwrap().is_empty());

    let missing = cli(&server, &["runs", "answer", &id]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(stderr(&missing).contains("--text"), "{}", stderr(&missing));
    let both = cli(&server, &["runs", "answer", &id, "--text", "a", "--json", r#""b""#]);
    assert_eq!(both.status.code(), Some(2));
    assert!(stderr(&both).contains("not both"), "{}", stderr(&both));
    let typo = cli(&server, &["runs", "answer", &id, "APR_1", "--text", "a"]);
    assert_eq!(typo.status.code(), Some(2));
    assert!(stderr(&typo).contains("`APR_1` is not an approval id"), "{}", stderr(&typo));
    // A wrong answer (a negative number is an answer, not a flag) is the
    // API's 400, named; nothing changes.
    let refused = cli(&server, &["runs", "answer", &id, "--json", "-7"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(stderr(&refused).contains("400") && stderr(&refused).contains("string"), "{}", stderr(&refused));
    let answered = cli(&server, &["runs", "answer", &id, "--text", "staging"]);
    assert!(answered.status.success(), "{}", stderr(&answered));
    assert!(stdout(&answered).contains("answered"), "{}", stdout(&answered));

    let run = server.wait_for(&key, &id, std::time::Duration::from_secs(20), |run| {
        run["status"] == "awaiting_approval" && run["pending_approvals"].as_array().unwrap().len() == 2
    });
    let second = run["pending_approvals"][1]["id"].as_str().unwrap();
    // The approval's id after the JSON reads as well as before it.
    let answered = cli(&server, &["runs", "answer", &id, "--json", r#""three""#, second]);
    assert!(answered.status.success(), "{}", stderr(&answered));
    let decided: Value = serde_json::from_str(&stdout(&answered)).unwrap();
    assert_eq!(decided["pending_approvals"][1]["answer"], "three");
    let done = server.wait_for_status(&key, &id, "succeeded");
    assert_eq!(done["output"], "answered: staging\nanswered: three\ndone");

    // Without an id, an answer goes only to a question: not to an action.
    let action = json(&server, &["runs", "create", "--agent", "script", "--input", "approve Deploy"]);
    let action_id = action["id"].as_str().unwrap().to_owned();
    server.wait_for_status(&key, &action_id, "awaiting_approval");
    let no_question = cli(&server, &["runs", "answer", &action_id, "--text", "yes"]);
    assert_eq!(no_question.status.code(), Some(2));
    assert!(stderr(&no_question).contains("has no pending question"), "{}", stderr(&no_question));
}

/// The help of `args` (a command path).
fn help(args: &[&str]) -> String {
    let output = Command::new(BIN).args(args).arg("--help").output().expect("the binary runs");
    assert!(output.status.success(), "{args:?} --help: {}", stderr(&output));
    stdout(&output)
}

/// Every command, each with its help: what `help` lists under Commands.
fn every_command(path: Vec<String>, found: &mut Vec<(Vec<String>, String)>) {
    let args: Vec<&str> = path.iter().map(String::as_str).collect();
    let text = help(&args);
    let commands: Vec<String> = text
        .split("Commands:\n")
        .nth(1)
        .map(|section| {
            section
                .lines()
                .take_while(|line| line.starts_with("  "))
                .filter_map(|line| line.split_whitespace().next())
                .filter(|name| *name != "help")
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    found.push((path.clone(), text));
    for command in commands {
        every_command([path.clone(), vec![command]].concat(), found);
    }
}

/// `text` without the bracketed notes clap adds to an option's help.
fn without_clap_notes(text: &str) -> String {
    let mut rest = text.to_owned();
    for note in ["[env: ", "[default: ", "[possible values: ", "[aliases: "] {
        while let Some(start) = rest.find(note) {
            let end = rest[start..].find(']').map_or(rest.len(), |end| start + end + 1);
            rest.replace_range(start..end, "");
        }
    }
    rest
}

#[test]
fn every_option_has_help_and_the_database_is_offered_only_where_it_is_used() {
    assert_eq!(without_clap_notes("  [env: AGENT_RUNS_DB=] [default: .agent-runs/runs.db]").trim(), "");
    assert_eq!(without_clap_notes("The file [default: x]").trim(), "The file");
    let mut commands = Vec::new();
    every_command(Vec::new(), &mut commands);
    assert!(commands.len() > 30, "{}", commands.len());
    for (path, text) in &commands {
        let lines: Vec<&str> = text.lines().collect();
        for (index, line) in lines.iter().enumerate() {
            let entry = line.trim_start();
            let is_entry = line.starts_with("  ")
                && !line.starts_with("          ")
                && (entry.starts_with('-') || entry.starts_with('<') || entry.starts_with('['));
            if !is_entry {
                continue;
            }
            // The words after the flag and its value name, on its line or
            // the lines below, further in; what clap adds by itself
            // (`[env: ...]`, `[default: ...]`) is not help.
            let here = entry.split_once("  ").map_or("", |(_, rest)| rest).to_owned();
            let below = lines[index + 1..].iter().take_while(|next| next.starts_with("          "));
            let said = below.fold(here, |said, next| said + " " + next.trim());
            assert!(
                !without_clap_notes(&said).trim().is_empty(),
                "`agent-runs {}`: `{}` has no help",
                path.join(" "),
                entry
            );
        }
        let offers_db = text.contains("--db <DB>");
        let uses_db = matches!(path.first().map(String::as_str), Some("serve" | "keys" | "agents"));
        assert_eq!(offers_db, uses_db, "`agent-runs {}` and --db", path.join(" "));
    }
}

#[test]
fn json_is_taken_before_the_subcommand_and_keys_list_is_aligned() {
    let server = Server::start();
    let before = cli(&server, &["runs", "--json", "list", "--limit", "1"]);
    assert!(before.status.success(), "{}", stderr(&before));
    let page: Value = serde_json::from_str(&stdout(&before)).expect("JSON");
    assert!(page["data"].is_array());
    server.admin(&["keys", "create", "--owner", "an-owner-with-a-name-longer-than-twenty", "--name", "ci"]);
    let listed = server.admin(&["keys", "list"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert!(lines.len() >= 3, "{listed}");
    for column in ["OWNER", "CREATED", "STATUS", "SCOPES"] {
        let at = lines[0].find(column).unwrap();
        for line in &lines[1..] {
            assert_eq!(&line[at - 2..at], "  ", "{column} starts at {at} in every row:\n{listed}");
            assert_ne!(line.as_bytes()[at], b' ', "{column} starts at {at} in every row:\n{listed}");
        }
    }
}
