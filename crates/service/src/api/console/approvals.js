// @ts-check
// A run's approvals in its detail: what each asks and how it was decided,
// and for a pending one the person's ways to decide it (Approve, an edit of
// the call, Reject; a question's form), including the confirmation the
// keyboard's a and r open first.
import { api } from "./api.js";
import { answerForm } from "./answers.js";
import { argumentsEditor, argumentsProblem, argumentsText, editDiff, withoutLayout } from "./arguments.js";
import { markCurrent, renderRun } from "./detail.js";
import { ago, el, status, when, $ } from "./dom.js";
import { advance } from "./list.js";
import { failed, notice } from "./notice.js";
import { decider, secondPersonNeeded } from "./people.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Run} Run */
/** @typedef {import("./api.js").Approval} Approval */

/**
 * How a pending call's or action's box decides: `asked` "approve" or
 * "reject"; `typed`, the arguments the confirmation showed (else the
 * editor's now). A question's box has none: its buttons decide.
 * @typedef {(asked: "approve" | "reject", typed?: string) => void} Decide
 */

/** @type {WeakMap<HTMLElement, Decide>} */
const decides = new WeakMap();

/**
 * An approval's box in the run's detail.
 * @param {Run} run
 * @param {Approval} approval
 */
export function approvalView(run, approval) {
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
  // Approve with the arguments changed is an edit.
  /** @type {Decide} */
  const decide = (asked, typed) => {
    const arguments_ = call ? typed ?? call.editor.value : null;
    const decision = asked === "approve" && call && call.edited(arguments_) ? "edit" : asked;
    /** @type {Record<string, unknown>} */
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
  decides.set(box, decide);
  approve.addEventListener("click", () => decide("approve"));
  actions.append(approve);
  actions.append(el("button", { type: "button", class: "danger reject", onclick: () => decide("reject") },
    approval.auto_approves_at ? "Veto (reject)" : "Reject"));
  box.append(actions);
  return box;
}

/**
 * Sends a decision of `approval` (its JSON `text`): one at a time, the box's
 * buttons waiting for the answer; `said` once recorded, else the service's
 * complaint in `problem` (when given) and the banner.
 * @param {HTMLElement} box
 * @param {Run} run
 * @param {Approval} approval
 * @param {string} text
 * @param {string} said
 * @param {HTMLElement | null} problem
 */
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

/**
 * A pending question: the form its schema makes, Answer and Decline.
 * @param {Run} run
 * @param {Approval} approval
 * @param {HTMLElement} box
 */
function questionView(run, approval, box) {
  const form = answerForm(approval.input_schema || { type: "string" });
  const problem = el("div", { class: "invalid", role: "status" });
  form.element.addEventListener("input", () => { problem.textContent = ""; });
  const comment = el("input", { class: "comment", placeholder: "comment (a decline's reason reaches the agent)" });
  /** @param {"answer" | "reject"} decision */
  const send = (decision) => {
    /** @type {Record<string, unknown>} */
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

/**
 * The confirmation `a` and `r` open: the exact call, and for a rejection
 * the reason (it reaches the model). Enter confirms, Escape cancels.
 * @param {HTMLElement} box the approval's box
 * @param {HTMLElement} button the button confirming presses (when the box has no decide)
 * @param {boolean} rejecting
 */
export function confirmDecision(box, button, rejecting) {
  if (state.closeConfirm) state.closeConfirm();
  const dialog = $("confirm");
  // The call as it would be made (an edit as typed), or as proposed for a rejection.
  const shown = box.querySelector(".arguments");
  const editor = shown instanceof HTMLTextAreaElement ? shown : null;
  const edited = editor && withoutLayout(editor.value) !== withoutLayout(editor.defaultValue);
  const callText = !shown ? null : !editor ? shown.textContent : rejecting ? editor.defaultValue : editor.value;
  const reason = el("input", { class: "reason", placeholder: "the reason (it reaches the model)" });
  /** @type {HTMLInputElement | null} */
  const comment = box.querySelector(".comment");
  reason.value = comment ? comment.value : "";
  const opener = /** @type {HTMLElement | null} */ (document.activeElement);
  const close = () => {
    dialog.hidden = true;
    dialog.replaceChildren();
    document.removeEventListener("keydown", keys, true);
    state.closeConfirm = null;
    if (opener && opener.focus) opener.focus();
  };
  const confirm = () => {
    if (rejecting && comment) comment.value = reason.value;
    close();
    // Exactly the call shown: whatever the editor holds by now.
    const decide = decides.get(box);
    if (decide) decide(rejecting ? "reject" : "approve", editor && !rejecting ? callText : undefined);
    else button.click();
  };
  /** @param {KeyboardEvent} event */
  const keys = (event) => {
    const inside = dialog.contains(/** @type {Node} */ (event.target));
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
