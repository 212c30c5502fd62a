// @ts-check
// The Runs tab: the owner's runs, newest first, by status.
import { ago, el, status, $ } from "./dom.js";

/** @typedef {import("./api.js").Run} Run */

/**
 * The runs list's request: the runs of the status picked (any when none).
 * @returns {{ path: string, params: URLSearchParams }}
 */
export function runsQuery() {
  const params = new URLSearchParams();
  const wanted = /** @type {HTMLSelectElement} */ ($("status-filter")).value;
  if (wanted) params.set("status", wanted);
  return { path: "/v1/agent/runs", params };
}

/**
 * A run's entry in the list.
 * @param {Run} run
 */
export function runEntry(run) {
  return el(
    "li",
    {},
    el("div", {}, status(run.status), " ", run.agent),
    el("div", { class: "meta" }, el("span", { class: "id" }, run.id), " · " + ago(run.created_at) + " ago"),
    el("div", { class: "meta" }, run.input.slice(0, 120)),
  );
}
