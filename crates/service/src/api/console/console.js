// The Agent Runs console: the approvals inbox, runs, a run's events and its
// decisions, through the same HTTP API as every client. The key lives in
// this tab's sessionStorage only. Every text from the API is set with
// textContent, never parsed as HTML.
"use strict";

const KEY = "agent-runs-key";
// The API's base: the page is `<base>/console` (a stage or base path may precede it).
const BASE = location.pathname.replace(/\/console$/, "");
const $ = (id) => document.getElementById(id);
const state = {
  view: "inbox",
  items: [],
  selected: -1,
  cursor: null,
  runId: null, // the run shown (or being loaded)
  approvalId: null, // the approval the person picked in the inbox or clicked: the one a and r decide
  shown: "", // the signature of what the detail shows
  renderedAt: 0,
  follow: null, // aborts the events loop of the shown run
  events: [], // the shown run's events so far
  canDecide: true, // whether the key may decide (approvals:decide)
  canCreate: true, // whether the key may create runs (runs:write), to continue one
  run: null, // the shown run as last drawn
  keys: new Map(), // the owner's keys by id: names of who created and who decided
  me: null, // the id of the key in use
  agents: new Map(), // what GET /v1/agents/{agent} said, by agent name
  poll: null, // the timer that refreshes the list
  session: new AbortController(), // aborts every request of the key in use
  listSeq: 0, // the latest list request: an older answer is dropped
  listError: false, // whether the banner is a list's error (a later list clears it)
  closeConfirm: null, // closes the open confirmation
  scrollToDetail: null, // a run tapped on a phone: its detail is scrolled to once drawn
  drafts: new Map(), // what a person typed into a pending call's arguments (or comment), by approval id
};

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

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// A banner: an error stays until something succeeds or another error
// replaces it; a confirmation leaves by itself after a few seconds.
function notice(message, ok) {
  state.listError = false;
  const box = $("notice");
  box.textContent = message || "";
  box.hidden = !message;
  box.className = ok ? "ok" : "";
  clearTimeout(state.noticeTimer);
  if (ok && message) state.noticeTimer = setTimeout(() => { if (box.textContent === message) notice(""); }, 6000);
}

class ApiError extends Error {}

async function api(path, options = {}) {
  const key = sessionStorage.getItem(KEY);
  const headers = Object.assign({ Authorization: "Bearer " + key }, options.headers || {});
  // `text`: the JSON body, as text (an edit's arguments go as typed).
  if (options.text !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(BASE + path, {
    method: options.method || "GET",
    headers,
    body: options.text,
    signal: options.signal ? AbortSignal.any([options.signal, state.session.signal]) : state.session.signal,
  });
  if (options.raw) return response;
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error ? body.error.message : "HTTP " + response.status;
    throw Object.assign(new ApiError(message), { status: response.status });
  }
  return body;
}

// A time as "3m ago" (or "in 3m"), with the exact time on hover.
function when(iso) {
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return el("time", { datetime: iso, title: iso }, seconds >= 0 ? duration(seconds) + " ago" : "in " + duration(-seconds));
}

function ago(iso) {
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return duration(Math.abs(seconds));
}

function duration(seconds) {
  if (seconds < 90) return seconds + "s";
  if (seconds < 5400) return Math.round(seconds / 60) + "m";
  if (seconds < 172800) return Math.round(seconds / 3600) + "h";
  return Math.round(seconds / 86400) + "d";
}

function status(name) {
  return el("span", { class: "status " + name }, name);
}

// ------------------------------------------------------------------ lists

// Loads the list (or its next page); the first entry is opened unless the
// person is looking at a run (`keep`), as after a decision.
async function loadList(more, keep) {
  if (state.view === "policy") return loadPolicy();
  const agent = $("agent-filter").value.trim();
  const params = new URLSearchParams();
  let path;
  if (state.view === "inbox") {
    params.set("status", "pending");
    if (agent) params.set("agent", agent);
    if ($("kind-filter").value) params.set("kind", $("kind-filter").value);
    path = "/v1/approvals";
  } else {
    const wanted = $("status-filter").value;
    if (wanted) params.set("status", wanted);
    path = "/v1/agent/runs";
  }
  params.set("limit", "20");
  if (more && state.cursor) params.set("cursor", state.cursor);
  state.cursorUsed = Boolean(more);
  const seq = ++state.listSeq;
  const view = state.view;
  try {
    const page = await api(path + "?" + params);
    if (seq !== state.listSeq || view !== state.view) return; // a later list was asked for
    if (state.listError) notice(""); // the list's earlier error is no longer news
    state.items = more ? state.items.concat(page.data) : page.data;
    state.cursor = page.next_cursor;
    if (!more) {
      // The item picked before, if it is still listed.
      const picked = state.view === "inbox" ? state.approvalId : state.runId;
      state.selected = keep ? state.items.findIndex((item) => item.id === picked) : -1;
    }
    renderList();
    if (!more && !keep && state.items.length) select(0);
  } catch (error) {
    if (seq === state.listSeq) failed(error, true);
  }
}

// The owner's approval policy, read only: each rule and when it applies.
async function loadPolicy() {
  try {
    const policy = await api("/v1/policies");
    state.items = [];
    state.cursor = null;
    const list = $("list");
    list.replaceChildren(
      el("li", { class: "meta" }, policy.version
        ? "Policy version " + policy.version + " · put " + policy.updated_at + " by " + policy.updated_by
        : "No policy: each tool's own setting decides which calls need a person."),
    );
    for (const rule of policy.rules) {
      const when = rule.when.map((c) => el("div", { class: "meta" }, "when " + c.path + " " + c.op + " " + JSON.stringify(c.value)));
      list.append(el(
        "li",
        { class: "rule" },
        el("div", {}, el("strong", {}, rule.id), " " + rule.effect + (rule.mode === "log_only" ? " (log only)" : "")),
        el("div", { class: "meta" }, "agent " + rule.agent + " · tool " + rule.tool),
        ...when,
        rule.reason ? el("div", { class: "meta" }, "reason: " + rule.reason) : null,
      ));
    }
    $("more").hidden = true;
  } catch (error) {
    failed(error);
  }
}

function renderList() {
  const list = $("list");
  list.replaceChildren();
  state.items.forEach((item, index) => {
    const entry = state.view === "inbox" ? inboxEntry(item) : runEntry(item);
    entry.dataset.index = String(index);
    if (index === state.selected) entry.classList.add("selected");
    entry.addEventListener("click", () => {
      select(index);
      // On a phone the detail is below the list: a tap takes the person there
      // (now, or once the run is drawn).
      if (!matchMedia("(max-width: 700px)").matches) return;
      if ($("detail").dataset.run === runIdOf(item)) $("detail").scrollIntoView({ block: "start" });
      else state.scrollToDetail = runIdOf(item);
    });
    list.append(entry);
  });
  if (!state.items.length) {
    list.append(el("li", { class: "meta" }, state.view === "inbox" ? "Nothing waits for a decision." : "No runs."));
  }
  $("more").hidden = !state.cursor;
}

function inboxEntry(approval) {
  const left = (at) => duration(Math.max(0, (Date.parse(at) - Date.now()) / 1000 | 0));
  // A veto window ends before any expiry: its end is what to say.
  const expires = approval.auto_approves_at
    ? "auto-approves in " + left(approval.auto_approves_at)
    : approval.expires_at ? "expires in " + left(approval.expires_at) : "";
  return el(
    "li",
    {},
    el("div", {}, approval.action),
    el("div", { class: "meta" }, approval.agent + " · waiting " + ago(approval.requested_at) + (expires ? " · " + expires : "")),
    el("div", { class: "meta" }, el("span", { class: "id" }, approval.run_id)),
  );
}

function runEntry(run) {
  return el(
    "li",
    {},
    el("div", {}, status(run.status), " ", run.agent),
    el("div", { class: "meta" }, el("span", { class: "id" }, run.id), " · " + ago(run.created_at) + " ago"),
    el("div", { class: "meta" }, run.input.slice(0, 120)),
  );
}

function runIdOf(item) {
  return item.run_id || item.id;
}

function select(index) {
  if (index < 0 || index >= state.items.length) return;
  state.selected = index;
  for (const node of $("list").children) {
    const on = node.dataset.index === String(index);
    node.classList.toggle("selected", on);
    if (on) node.scrollIntoView({ block: "nearest" });
  }
  // An inbox entry is one approval: a and r decide exactly that one.
  state.approvalId = state.view === "inbox" ? state.items[index].id : null;
  markCurrent();
  showRun(runIdOf(state.items[index]));
}

// After a decision in the inbox: the list again, without what was decided,
// and the item now in the decided one's place shown.
async function advance() {
  const at = Math.max(state.selected, 0);
  await loadList(false, true);
  if (state.items.length) select(Math.min(at, state.items.length - 1));
}

// The list again now and then, keeping what is selected, unless the person
// is typing or a confirmation is open.
function refreshNowAndThen() {
  clearInterval(state.poll);
  state.poll = setInterval(() => {
    const busy = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName) || !$("confirm").hidden;
    // Not over pages the person loaded with More (only the first is read again).
    if (!busy && !$("app").hidden && state.view !== "policy" && !state.cursorUsed) loadList(false, true);
  }, 10000);
}

// ------------------------------------------------------------------ a run

async function showRun(runId) {
  const switched = state.runId !== runId;
  state.runId = runId;
  if (switched) {
    // Until the new run is drawn, nothing of the old one may be decided.
    for (const box of document.querySelectorAll("#detail .approval[data-pending]")) delete box.dataset.pending;
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

// What decides whether the run's view must be built again: a change of
// status, output or approvals (an extend moves their ends). Anything else
// (an expiry warning) leaves what the person is typing alone.
function signature(run) {
  return JSON.stringify([run.id, run.status, run.output, run.error, run.pending_approvals.map((a) => [a.id, a.status, a.expires_at, a.auto_approves_at])]);
}

function renderRun(run) {
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
    ? [focused.closest(".approval").dataset.approval, focused.className] : null;
  detail.replaceChildren(...parts.filter((part) => part !== null));
  if (typingIn) {
    const box = detail.querySelector(`.approval[data-approval="${CSS.escape(typingIn[0])}"]`);
    const again = box && [...box.querySelectorAll("textarea, input")].find((node) => node.className === typingIn[1]);
    if (again) again.focus();
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
  const pending = document.querySelectorAll("#detail .approval[data-pending]");
  return pending.length === 1 ? pending[0].dataset.approval : null;
}

function markCurrent() {
  const current = currentApprovalId();
  for (const box of document.querySelectorAll("#detail .approval")) {
    const on = box.dataset.approval === current;
    box.classList.toggle("current", on);
    if (on) box.setAttribute("aria-current", "true");
    else box.removeAttribute("aria-current");
  }
}

function approvalView(run, approval) {
  const box = el("div", { class: "approval", "data-approval": approval.id });
  box.addEventListener("click", () => {
    state.approvalId = approval.id;
    markCurrent();
  });
  box.append(el("div", {}, status(approval.status), " ", el("strong", { class: "action" }, approval.action)));
  // Whether this key may not decide it (`undefined`: not known yet); the
  // agent is asked only for a pending approval this key might decide.
  const secondPerson = approval.status !== "pending" || !state.canDecide || secondPersonNeeded(run);
  if (approval.kind === "tool_call") {
    box.append(el("div", { class: "meta" }, "tool " + approval.tool + " · sha256 " + approval.arguments_sha256.slice(0, 12) + "…"));
    if (approval.tool_changed) {
      box.append(el("div", { class: "warning tool-changed" },
        "This tool changed on its MCP server since the operator pinned it (agents put): check what it does before approving."));
    }
    // A pending call a person may decide shows its arguments once, in the editor below.
    if (secondPerson !== false) box.append(el("pre", { class: "arguments" }, argumentsText(approval.arguments)));
    if (approval.edited_arguments) {
      box.append(el("div", { class: "meta" }, "approved with edited arguments (- proposed, + approved):"));
      box.append(editDiff(approval.arguments, approval.edited_arguments));
    }
  }
  if (approval.kind === "input" && approval.status === "answered") {
    box.append(el("div", { class: "meta" }, "answer:"), el("pre", { class: "answer" }, JSON.stringify(approval.answer, null, 2)));
  }
  if (approval.policy) {
    const rule = approval.policy;
    box.append(el("div", { class: "meta policy" }, rule.mode === "log_only"
      ? "policy rule " + rule.rule + " (log only) would " + rule.effect
      : "policy rule " + rule.rule + ": " + rule.effect + " (version " + rule.version + ")"));
  }
  if (approval.resolved_by) box.append(el("div", { class: "meta" }, "decided by ", decider(approval.resolved_by), approval.comment ? ": " + approval.comment : ""));
  if (approval.status !== "pending") return box;
  box.dataset.pending = "";
  if (!state.canDecide) {
    box.append(el("div", { class: "meta" }, "waiting " + ago(approval.requested_at) + " · this key may not decide (it lacks approvals:decide)"));
    return box;
  }
  // Said before anyone tries: the API would answer 403.
  if (secondPerson !== false) {
    box.dataset.blocked = secondPerson
      ? "This run's agent needs a second person: another key than the one that created the run must decide."
      : "Checking whether this run's agent needs a second person…";
    box.append(el("div", { class: secondPerson ? "warning second-person" : "meta" }, "waiting " + ago(approval.requested_at) + " · " + box.dataset.blocked));
    return box;
  }
  // One with a veto window never expires: its window ends first.
  box.append(el("div", { class: "meta" }, "asked ", when(approval.requested_at),
    approval.expires_at && !approval.auto_approves_at ? el("span", {}, " · expires ", when(approval.expires_at)) : null));
  if (approval.auto_approves_at) {
    // A veto window: it runs then unless someone rejects (Veto) first.
    box.append(el("div", { class: "warning veto" }, "auto-approves ", when(approval.auto_approves_at),
      " unless someone objects: Veto rejects it."));
  }
  if (approval.kind === "input") return questionView(run, approval, box);
  const comment = el("input", { class: "comment", placeholder: "comment (a rejection's reason reaches the model)" });
  const actions = el("div", { class: "actions" }, comment);
  const call = approval.kind === "tool_call" ? argumentsEditor(approval) : null;
  const approve = el("button", { type: "button", class: "primary approve" }, "Approve");
  const label = () => { approve.textContent = call && call.edited(call.editor.value) ? "Approve edited" : "Approve"; };
  if (call) {
    call.editor.addEventListener("input", () => {
      call.problem.textContent = argumentsProblem(call.editor.value);
      label();
    });
    box.append(call.editor, call.problem);
    label();
  }
  comment.value = state.drafts.get(approval.id + "/comment") ?? "";
  comment.addEventListener("input", () => state.drafts.set(approval.id + "/comment", comment.value));
  // `typed`: the arguments the confirmation showed (else the editor's now).
  // Approve with the arguments changed is an edit.
  const decide = (asked, typed) => {
    const arguments_ = call ? typed ?? call.editor.value : null;
    const decision = asked === "approve" && call && call.edited(arguments_) ? "edit" : asked;
    const body = { decision, comment: comment.value || null };
    if (approval.arguments_sha256) body.arguments_sha256 = approval.arguments_sha256;
    let text = JSON.stringify(body);
    if (decision === "edit") {
      call.problem.textContent = argumentsProblem(arguments_);
      if (call.problem.textContent) return;
      // The arguments go as typed, never through JSON.parse and back: a
      // number no double holds would silently become another one. The
      // service refuses such numbers with a message saying so.
      text = text.slice(0, -1) + ',"arguments":' + arguments_ + "}";
    }
    postDecision(box, run, approval, text, "Recorded: " + decision + ".", decision === "edit" ? call.problem : null);
  };
  box.decide = decide;
  approve.addEventListener("click", () => decide("approve"));
  actions.append(approve);
  actions.append(el("button", { type: "button", class: "danger reject", onclick: () => decide("reject") },
    approval.auto_approves_at ? "Veto (reject)" : "Reject"));
  box.append(actions);
  return box;
}

// Sends a decision of `approval` (its JSON `text`): one at a time, the box's
// buttons waiting for the answer; `said` once recorded, else the service's
// complaint in `problem` (when given) and the banner.
async function postDecision(box, run, approval, text, said, problem) {
  const buttons = [...box.querySelectorAll("button")];
  if (buttons.some((button) => button.disabled)) return;
  buttons.forEach((button) => { button.disabled = true; });
  try {
    const path = "/v1/agent/runs/" + encodeURIComponent(run.id) + "/approvals/" + encodeURIComponent(approval.id);
    const decided = await api(path, { method: "POST", text });
    notice(said, true);
    renderRun(decided);
    if (state.view === "inbox") advance();
  } catch (error) {
    if (problem) problem.textContent = error.message;
    failed(error);
  } finally {
    buttons.forEach((button) => { button.disabled = false; });
  }
}

// A pending question: the form its schema makes, Answer and Decline.
function questionView(run, approval, box) {
  const form = answerForm(approval.input_schema || { type: "string" });
  const problem = el("div", { class: "invalid", role: "status" });
  form.element.addEventListener("input", () => { problem.textContent = ""; });
  const comment = el("input", { class: "comment", placeholder: "comment (a decline's reason reaches the agent)" });
  const send = (decision) => {
    const body = { decision, comment: comment.value || null };
    let text = JSON.stringify(body);
    if (decision === "answer") {
      const read = form.read();
      problem.textContent = read.problem || "";
      if (read.problem) return;
      if (read.text !== undefined) text = text.slice(0, -1) + ',"answer":' + read.text + "}";
      else text = JSON.stringify(Object.assign(body, { answer: read.answer }));
    }
    // The service's complaint (what the schema refuses, and where) shows by the form.
    postDecision(box, run, approval, text, decision === "answer" ? "Answered." : "Declined.", problem);
  };
  const actions = el("div", { class: "actions" }, comment,
    el("button", { type: "button", class: "primary answer", onclick: () => send("answer") }, "Answer"),
    el("button", { type: "button", class: "danger reject", onclick: () => send("reject") }, "Decline"));
  box.append(form.element, problem, actions);
  return box;
}

// The confirmation `a` and `r` open: the exact call, and for a rejection
// the reason (it reaches the model). Enter confirms, Escape cancels.
function confirmDecision(box, button, rejecting) {
  if (state.closeConfirm) state.closeConfirm();
  const dialog = $("confirm");
  // The call as it would be made (an edit as typed), or as proposed for a rejection.
  const shown = box.querySelector(".arguments");
  const typed = shown && shown.tagName === "TEXTAREA";
  const edited = typed && withoutLayout(shown.value) !== withoutLayout(shown.defaultValue);
  const callText = !shown ? null : !typed ? shown.textContent : rejecting ? shown.defaultValue : shown.value;
  const reason = el("input", { class: "reason", placeholder: "the reason (it reaches the model)" });
  reason.value = box.querySelector(".comment") ? box.querySelector(".comment").value : "";
  const opener = document.activeElement;
  const close = () => {
    dialog.hidden = true;
    dialog.replaceChildren();
    document.removeEventListener("keydown", keys, true);
    state.closeConfirm = null;
    if (opener && opener.focus) opener.focus();
  };
  const confirm = () => {
    const comment = box.querySelector(".comment");
    if (rejecting && comment) comment.value = reason.value;
    close();
    // Exactly the call shown: whatever the editor holds by now.
    if (box.decide) box.decide(rejecting ? "reject" : "approve", typed && !rejecting ? callText : undefined);
    else button.click();
  };
  const keys = (event) => {
    const inside = dialog.contains(event.target);
    const onPage = event.target === document.body || event.target === document.documentElement;
    if (event.key === "Escape") close();
    // Enter confirms from the reason or the page; on the dialog's buttons
    // it presses the one focused; from any other field it does nothing.
    else if (event.key === "Enter" && !event.isComposing && (event.target === reason || event.target === dialog || onPage)) confirm();
    else if (inside) return;
    event.preventDefault();
    event.stopImmediatePropagation();
  };
  const parts = [
    el("strong", {}, (rejecting ? "Reject: " : edited ? "Approve, edited: " : "Approve: ") + box.querySelector(".action").textContent),
    callText === null ? null : el("pre", {}, callText),
    rejecting ? reason : null,
    el("div", { class: "actions" },
      el("button", { type: "button", class: rejecting ? "danger" : "primary", onclick: confirm }, rejecting ? "Reject" : "Approve"),
      el("button", { type: "button", onclick: close }, "Cancel"),
      el("span", { class: "hint" }, "Enter confirms, Escape cancels")),
  ];
  dialog.replaceChildren(...parts.filter((part) => part !== null));
  dialog.setAttribute("aria-label", rejecting ? "Confirm the rejection" : "Confirm the approval");
  dialog.hidden = false;
  document.addEventListener("keydown", keys, true);
  state.closeConfirm = close;
  // Not on a button: a Space typed by someone still writing JSON confirms nothing.
  if (rejecting) reason.focus();
  else dialog.focus();
}

// ------------------------------------------------------------------ events, live

function eventLine(event) {
  const data = event.data || {};
  const detail = data.text !== undefined ? data.text : data.action !== undefined ? data.action : data.error || data.output || data.tool || "";
  return el("li", { "data-seq": String(event.seq) }, el("span", { class: "meta" }, "#" + event.seq + " " + event.created_at.slice(11, 19) + " "), event.type + " ", String(detail));
}

const TERMINAL = ["run.succeeded", "run.failed", "run.canceled"];

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); });
  });

// Follows the run's events: Server-Sent Events where the server streams
// (the embedded server), else JSON pages held open with `wait`. A failure
// is retried after a growing pause; showing another run stops it.
async function follow(runId) {
  if (state.follow) state.follow.abort();
  const controller = new AbortController();
  state.follow = controller;
  state.events = [];
  let after = 0;
  let pause = 1000;
  const add = (events) => {
    if (controller.signal.aborted) return true;
    // Shown only once the detail shows this run; kept for when it does.
    const list = $("detail").dataset.run === runId ? $("events") : null;
    for (const event of events) {
      if (event.seq <= after) continue;
      after = event.seq;
      state.events.push(event);
      if (list) list.append(eventLine(event));
    }
    if (events.length) pause = 1000;
    if (events.some((event) => event.type.startsWith("run.") || event.type.startsWith("approval."))) {
      api("/v1/agent/runs/" + encodeURIComponent(runId), { signal: controller.signal })
        .then((run) => controller.signal.aborted || renderRun(run))
        .catch(() => {});
    }
    return events.some((event) => TERMINAL.includes(event.type));
  };
  while (!controller.signal.aborted) {
    try {
      const path = "/v1/agent/runs/" + encodeURIComponent(runId) + "/events?after=" + after + "&wait=20";
      const response = await api(path, { raw: true, signal: controller.signal, headers: { Accept: "text/event-stream" } });
      if (response.status === 204) return;
      if (!response.ok) throw new ApiError((await response.json().catch(() => ({ error: {} }))).error.message || "HTTP " + response.status);
      const streamed = (response.headers.get("content-type") || "").startsWith("text/event-stream");
      if (streamed ? await readStream(response, add) : add((await response.json()).data)) return;
      if (streamed) await sleep(pause, controller.signal); // a stream that ended early
    } catch (error) {
      if (error.name === "AbortError") return;
      failed(error);
      await sleep(pause, controller.signal);
      pause = Math.min(pause * 2, 30000);
    }
  }
}

async function readStream(response, add) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const message = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = message.split("\n").filter((line) => line.startsWith("data: ")).map((line) => line.slice(6)).join("\n");
      if (data && add([JSON.parse(data)])) return true;
    }
  }
}

// ------------------------------------------------------------------ the page

// An error for the person; `fromList`: the banner a later list clears.
function failed(error, fromList) {
  if (error.name === "AbortError") return; // asked with a key no longer in use
  notice(error instanceof ApiError ? error.message : "The API could not be reached: " + error.message);
  state.listError = Boolean(fromList);
}

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
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY, $("key").value.trim());
    $("key").value = "";
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
    if (["INPUT", "TEXTAREA", "SELECT"].includes(event.target.tagName) || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "j") select(state.selected + 1);
    else if (event.key === "k") select(state.selected - 1);
    else if ((event.key === "a" || event.key === "r") && Date.now() - state.renderedAt > 1000) {
      // Never on a view that changed under the person's eyes a moment ago,
      // only on the approval the person picked (a run may wait on several),
      // and never by one key: a confirmation shows the exact call first.
      const box = document.querySelector("#detail .approval.current[data-pending]");
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
