// @ts-check
// A run's conversation: the runs of its thread (earlier and later, the one
// shown marked), and a box to continue an ended run with a new input.
import { api } from "./api.js";
import { showRun } from "./detail.js";
import { el, status, when } from "./dom.js";
import { loadList } from "./list.js";
import { failed, notice } from "./notice.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Run} Run */

/**
 * Fills the run's thread into `box` once per run shown; nothing when the
 * run is alone in its thread.
 * @param {Run} run
 * @param {HTMLElement} box
 */
export async function loadThread(run, box) {
  try {
    /** @type {import("./api.js").Page<Run>} */
    const page = await api("/v1/agent/runs?limit=50&thread_id=" + encodeURIComponent(run.thread_id));
    if (run.id !== state.runId || page.data.length < 2) return;
    const entries = page.data.slice().reverse().map((other) => {
      const item = el("li", { class: other.id === run.id ? "current" : "" },
        el("button", { type: "button", class: "thread-run", "data-run": other.id, title: other.id },
          status(other.status), " ", other.input.length > 80 ? other.input.slice(0, 80) + "…" : other.input),
        " ", el("span", { class: "meta" }, when(other.created_at)));
      item.querySelector("button").addEventListener("click", () => showRun(other.id));
      return item;
    });
    const more = page.next_cursor ? el("p", { class: "meta" }, "Older runs of this conversation are not shown.") : null;
    box.replaceChildren(el("h3", {}, "Conversation"), ...(more ? [more] : []), el("ol", { class: "thread" }, ...entries));
  } catch (error) {
    failed(error);
  }
}

/**
 * The box that continues an ended run: its agent gets the conversation so
 * far, then the new input; the new run is shown.
 * @param {Run} run
 */
export function continueView(run) {
  const input = el("textarea", { id: "continue-input", rows: "3", placeholder: "What next? The agent sees this conversation, then this." });
  const button = el("button", { type: "submit", class: "primary" }, "Continue");
  const form = el("form", { id: "continue-form" }, el("h3", {}, "Continue"), input, el("div", { class: "actions" }, button));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!input.value.trim() || button.disabled) return;
    button.disabled = true;
    try {
      const created = await api("/v1/agent/runs", {
        method: "POST",
        text: JSON.stringify({ input: input.value, previous_run_id: run.id }),
      });
      notice("Continued as " + created.id + ".", true);
      // Shown unless the person moved on to another run meanwhile.
      if (state.runId === run.id) showRun(created.id);
      if (state.view === "runs") loadList(false, true);
    } catch (error) {
      failed(error);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}
