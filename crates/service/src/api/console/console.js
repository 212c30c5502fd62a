// @ts-check
// The Agent Runs console: the approvals inbox, runs, a run's events and its
// decisions, through the same HTTP API as every client. The key lives in
// this tab's sessionStorage only. Every text from the API is set with
// textContent, never parsed as HTML.
//
// This is the page's one script, an ES module; the others are imported
// from it. Some import each other in a cycle (the list shows a run, a
// run's decision reads the list again): that is safe because no module
// calls another while it is being loaded, only later from an event.
import { KEY } from "./api.js";
import { confirmDecision } from "./approvals.js";
import { $ } from "./dom.js";
import { loadList, refreshNowAndThen, select } from "./list.js";
import { failed, notice } from "./notice.js";
import { loadKeys } from "./people.js";
import { state } from "./state.js";

/** @typedef {import("./state.js").View} View */

// Forgets everything shown for a key: the lists, the run, its events and
// their stream. Run before another key is used, and when one is forgotten.
function reset() {
  // Nothing asked with the previous key may paint anything any more.
  state.session.abort();
  state.session = new AbortController();
  clearInterval(state.poll);
  if (state.closeConfirm) state.closeConfirm();
  if (state.follow) state.follow.abort();
  Object.assign(state, { items: [], selected: -1, cursor: null, runId: null, approvalId: null, shown: "", events: [], follow: null, drafts: new Map(), run: null, keys: new Map(), me: null, agents: new Map() });
  $("list").replaceChildren();
  const detail = $("detail");
  detail.replaceChildren();
  delete detail.dataset.run;
  detail.hidden = true;
  $("more").hidden = true;
  $("tabs").hidden = true;
  $("app").hidden = true;
}

/** @param {View} view */
function showView(view) {
  state.view = view;
  state.cursor = null;
  $("tab-inbox").setAttribute("aria-pressed", String(view === "inbox"));
  $("tab-runs").setAttribute("aria-pressed", String(view === "runs"));
  $("tab-policy").setAttribute("aria-pressed", String(view === "policy"));
  $("agent-filter-label").hidden = view !== "inbox";
  $("kind-filter-label").hidden = view !== "inbox";
  $("status-filter-label").hidden = view !== "runs";
  loadList(false);
}

async function start() {
  reset();
  const session = state.session;
  const key = sessionStorage.getItem(KEY);
  if (!key) return;
  try {
    // Who is who, and what the key may do (the inbox and decisions need
    // approvals:decide; continuing a run, runs:write).
    const people = await loadKeys();
    if (session !== state.session) return; // another key, or Forget, since
    Object.assign(state, people);
    notice(""); // signed in: what was said before (an error, "forgotten") is past
    $("tab-inbox").hidden = !state.canDecide;
    $("tabs").hidden = false;
    $("app").hidden = false;
    showView(state.canDecide ? state.view : "runs");
    refreshNowAndThen();
  } catch (error) {
    if (session !== state.session) return;
    reset();
    failed(error);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const keyInput = /** @type {HTMLInputElement} */ ($("key"));
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, keyInput.value.trim());
    keyInput.value = "";
    start();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    clearInterval(state.poll);
    reset();
    notice("The key is forgotten.", true);
  });
  $("tab-inbox").addEventListener("click", () => showView("inbox"));
  $("tab-runs").addEventListener("click", () => showView("runs"));
  $("tab-policy").addEventListener("click", () => showView("policy"));
  $("refresh").addEventListener("click", () => loadList(false));
  $("more").addEventListener("click", () => loadList(true));
  $("status-filter").addEventListener("change", () => loadList(false));
  $("agent-filter").addEventListener("change", () => loadList(false));
  $("kind-filter").addEventListener("change", () => loadList(false));
  document.addEventListener("keydown", (event) => {
    if (!$("confirm").hidden) return; // the confirmation has the keyboard
    const target = /** @type {HTMLElement} */ (event.target);
    if (["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "j") select(state.selected + 1);
    else if (event.key === "k") select(state.selected - 1);
    else if ((event.key === "a" || event.key === "r") && Date.now() - state.renderedAt > 1000) {
      // Never on a view that changed under the person's eyes a moment ago,
      // only on the approval the person picked (a run may wait on several),
      // and never by one key: a confirmation shows the exact call first.
      /** @type {HTMLElement | null} */
      const box = document.querySelector("#detail .approval.current[data-pending]");
      /** @type {HTMLElement | null} */
      const button = box && box.querySelector(event.key === "a" ? ".approve" : ".reject");
      if (button) confirmDecision(box, button, event.key === "r");
      else if (box && box.dataset.blocked) notice(box.dataset.blocked);
      else if (box || !state.canDecide) notice(state.canDecide ? "Answer a question with its form." : "This key may not decide.");
      else notice("Pick the approval to decide first: select it in the inbox, or click it.");
      event.preventDefault();
    }
  });
  start();
});
