// @ts-check
// The shown run's events, live: Server-Sent Events where the server streams
// (the embedded server), else JSON pages held open with `wait` (API Gateway).
import { api, ApiError } from "./api.js";
import { renderRun } from "./detail.js";
import { el, $ } from "./dom.js";
import { failed } from "./notice.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").RunEvent} RunEvent */

/**
 * An event's line in the run's events list.
 * @param {RunEvent} event
 */
export function eventLine(event) {
  const data = event.data || {};
  const detail = data.text !== undefined ? data.text : data.action !== undefined ? data.action : data.error || data.output || data.tool || "";
  return el("li", { "data-seq": String(event.seq) }, el("span", { class: "meta" }, "#" + event.seq + " " + event.created_at.slice(11, 19) + " "), event.type + " ", String(detail));
}

const TERMINAL = ["run.succeeded", "run.failed", "run.canceled"];

/**
 * A pause that ends early when `signal` aborts.
 * @param {number} ms
 * @param {AbortSignal} signal
 * @returns {Promise<void>}
 */
const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); });
  });

/**
 * Follows the run's events until it ends. A failure is retried after a
 * growing pause; showing another run stops it.
 * @param {string} runId
 */
export async function follow(runId) {
  if (state.follow) state.follow.abort();
  const controller = new AbortController();
  state.follow = controller;
  state.events = [];
  let after = 0;
  let pause = 1000;
  /**
   * Takes in events (those seen before are skipped): whether the run ended.
   * @param {RunEvent[]} events
   */
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
      /** @type {Response} */
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

/**
 * Reads a stream of Server-Sent Events into `add`: true once `add` says the
 * run ended, false when the stream ends before.
 * @param {Response} response
 * @param {(events: RunEvent[]) => boolean} add
 */
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
