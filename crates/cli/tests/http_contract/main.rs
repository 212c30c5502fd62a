//! The wire contract (shared/CONTRACT.md), rule by rule, against the real
//! `agent-runs serve` binary over HTTP.

#[path = "../support/mod.rs"]
mod support;

use agent_runs_testkit::stand_in;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Server, Target, is_timestamp};

mod approvals;
mod conversations;
mod events;
mod mcp;
mod policies;
mod questions;
mod runs;
mod veto;

use approvals::*;
use conversations::*;
use events::*;
use mcp::*;
use policies::*;
use questions::*;
use runs::*;
use veto::*;

const RUNS: &str = "/v1/agent/runs";
const UNKNOWN_RUN: &str = "run_01JDQ3V7Q4K8Z2X9M5N6P7R8S9";

fn run_path(run: &Value) -> String {
    format!("{RUNS}/{}", run["id"].as_str().unwrap())
}

fn ids(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|run| run["id"].as_str().unwrap().to_owned()).collect()
}

/// Every rule above, against every way of serving.
macro_rules! on_every_target {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test] fn $name() { super::$name(super::Target::Embedded) })*
        }
        mod lambda {
            $(#[test] fn $name() {
                if crate::support::without_emulator(concat!("lambda::", stringify!($name))) {
                    return;
                }
                super::$name(super::Target::Lambda)
            })*
        }
    };
}

on_every_target!(
    missing_malformed_unknown_and_revoked_keys_answer_401_with_www_authenticate,
    the_bearer_scheme_is_case_insensitive,
    another_owners_run_is_indistinguishable_from_a_missing_one,
    create_answers_201_with_location_and_a_queued_run,
    create_validates_every_field_and_names_the_offender,
    bodies_over_256_kib_answer_413_and_other_media_types_415,
    an_idempotency_key_replays_the_original_run_and_refuses_a_different_body,
    list_pages_newest_first_without_repeats_or_gaps,
    list_filters_by_status_and_binds_the_cursor_to_the_filter,
    list_parameters_are_checked_strictly,
    a_created_run_is_in_the_next_list_and_get,
    get_answers_404_for_unknown_and_malformed_ids,
    unknown_paths_answer_404_and_other_methods_405_with_allow,
    cancel_in_every_state,
    approve_resumes_the_script_and_repeats_are_safe,
    reject_lets_the_script_go_on,
    decide_validates_its_body_and_ids,
    the_script_agent_says_sleeps_and_fails,
    too_many_active_runs_answer_429_with_retry_after,
    requests_over_the_rate_limit_answer_429_with_retry_after,
    a_defined_agent_is_managed_with_the_cli_and_waits_for_approval,
    an_mcp_server_is_pinned_by_the_cli_and_its_tools_are_gated,
    a_veto_window_is_shown_moved_by_extend_and_vetoed,
    events_tell_what_happened_to_a_run_in_order,
    events_parameters_are_checked_strictly,
    scopes_limit_what_a_key_may_do_and_decisions_name_their_key,
    the_inbox_lists_approvals_across_runs_newest_first,
    a_batch_decides_across_runs_all_or_nothing,
    policies_are_replaced_whole_conditionally_tried_on_history_and_enforced,
    a_script_asks_and_a_person_answers_or_declines,
    a_run_continues_an_ended_one_checked_in_the_contracts_order,
    a_defined_agent_is_asked_a_follow_up_and_the_oldest_turn_makes_room,
);
