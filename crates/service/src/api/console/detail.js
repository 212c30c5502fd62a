// @ts-check
// A run's detail: its input, output, approvals, conversation and events,
// drawn again only when what decides it changes (so what a person types
// survives), and which of its approvals a and r act on.
import { api } from "./api.js";
import { approvalView } from "./approvals.js";
import { continueView, loadThread } from "./conversation.js";
import { el, status, when, $ } from "./dom.js";
import { eventLine, follow } from "./events.js";
import { failed } from "./notice.js";
import { who } from "./people.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Run} Run */

/**
 * Shows the run: drawn once it is read, its events followed from now on.
 * @param {string} runId
 */
export async function showRun(runId) {
  const switched = state.runId !== runId;
  state.runId = runId;
  if (switched) {
    // Until the new run is drawn, nothing of the old one may be decided.
    for (const box of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("#detail .approval[data-pending]"))) delete box.dataset.pending;
    state.renderedAt = Date.now();
    state.shown = "";
    delete $("detail").dataset.run; // the events list is built anew for this run
    follow(runId);
  }
  try {
    const run = await api("/v1/agent/runs/" + encodeURIComponent(runId));
    renderRun(run);
  } catch (error) {
    failed(error);
  }
}

/**
 * What decides whether the run's view must be built again: a change of
 * status, output or approvals (an extend moves their ends). Anything else
 * (an expiry warning) leaves what the person is typing alone.
 * @param {Run} run
 */
function signature(run) {
  return JSON.stringify([run.id, run.status, run.output, run.error, run.pending_approvals.map((a) => [a.id, a.status, a.expires_at, a.auto_approves_at])]);
}

/**
 * Draws the run, if it is still the one shown and changed since drawn.
 * @param {Run} run
 */
export function renderRun(run) {
  if (run.id !== state.runId) return; // an answer for a run no longer shown
  state.run = run;
  if (signature(run) === state.shown) return;
  state.shown = signature(run);
  state.renderedAt = Date.now();
  const detail = $("detail");
  detail.hidden = false;
  const sameRun = detail.dataset.run === run.id;
  const events = sameRun && $("events") ? $("events") : el("ol", { id: "events" }, ...state.events.map(eventLine));
  const thread = sameRun && $("thread") ? $("thread") : el("div", { id: "thread" });
  if (!sameRun) loadThread(run, thread);
  detail.dataset.run = run.id;
  const parts = [
    el("h2", {}, el("span", { class: "id" }, run.id), " ", status(run.status)),
    el("div", { class: "meta" }, "agent " + run.agent + " · created ", when(run.created_at),
      run.created_by ? el("span", {}, " by ", who(run.created_by)) : "",
      run.previous_run_id ? el("span", {}, " · continues ", el("span", { class: "id" }, run.previous_run_id)) : ""),
    Object.keys(run.metadata || {}).length
      ? el("div", { class: "meta metadata" }, Object.entries(run.metadata).map(([name, value]) => name + "=" + value).join(" · "))
      : null,
    el("h3", {}, "Input"),
    el("pre", { id: "run-input" }, run.input),
    run.output !== null ? el("div", {}, el("h3", {}, "Output"), el("pre", { id: "run-output" }, run.output)) : null,
    run.error !== null ? el("div", {}, el("h3", {}, "Error"), el("pre", { id: "run-error" }, run.error)) : null,
    ...run.pending_approvals.map((approval) => approvalView(run, approval)),
    thread,
    ["succeeded", "failed", "canceled"].includes(run.status) && state.canCreate ? continueView(run) : null,
    el("h3", {}, "Events"),
    events,
  ];
  // What the person was typing in keeps the keyboard across the rebuild.
  const focused = document.activeElement;
  const typingIn = focused && detail.contains(focused) && focused.closest(".approval")
    ? [/** @type {HTMLElement} */ (focused.closest(".approval")).dataset.approval, focused.className] : null;
  detail.replaceChildren(...parts.filter((part) => part !== null));
  if (typingIn) {
    const box = detail.querySelector(`.approval[data-approval="${CSS.escape(typingIn[0])}"]`);
    const again = box && [...box.querySelectorAll("textarea, input")].find((node) => node.className === typingIn[1]);
    if (again) /** @type {HTMLElement} */ (again).focus();
  }
  markCurrent();
  if (state.scrollToDetail === run.id) {
    state.scrollToDetail = null;
    detail.scrollIntoView({ block: "start" });
  }
}

// The approval a and r act on: the one picked, or a run's only pending one.
function currentApprovalId() {
  if (state.approvalId) return state.approvalId;
  const pending = /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("#detail .approval[data-pending]"));
  return pending.length === 1 ? pending[0].dataset.approval : null;
}

// Marks the approval a and r act on (`current`), and only that one.
export function markCurrent() {
  const current = currentApprovalId();
  for (const box of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("#detail .approval"))) {
    const on = box.dataset.approval === current;
    box.classList.toggle("current", on);
    if (on) box.setAttribute("aria-current", "true");
    else box.removeAttribute("aria-current");
  }
}
