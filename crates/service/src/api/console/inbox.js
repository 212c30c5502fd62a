// @ts-check
// The Approvals tab (the inbox): what waits for a decision, by agent and kind.
import { ago, duration, el, $ } from "./dom.js";

/** @typedef {import("./api.js").InboxEntry} InboxEntry */

/**
 * The inbox's request: the pending approvals the filters let through.
 * @returns {{ path: string, params: URLSearchParams }}
 */
export function inboxQuery() {
  const params = new URLSearchParams();
  params.set("status", "pending");
  const agent = /** @type {HTMLInputElement} */ ($("agent-filter")).value.trim();
  if (agent) params.set("agent", agent);
  const kind = /** @type {HTMLSelectElement} */ ($("kind-filter")).value;
  if (kind) params.set("kind", kind);
  return { path: "/v1/approvals", params };
}

/**
 * An approval's entry in the list.
 * @param {InboxEntry} approval
 */
export function inboxEntry(approval) {
  /** @param {string} at */
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
