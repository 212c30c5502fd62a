// @ts-check
// The HTTP API, called from the same origin with the key in this tab's
// sessionStorage; and the shapes of what it answers, as far as the console
// reads them.
import { state } from "./state.js";

/**
 * @typedef {object} Run
 * @property {string} id
 * @property {string} status
 * @property {string} agent
 * @property {string} input
 * @property {string | null} output
 * @property {string | null} error
 * @property {Approval[]} pending_approvals every approval the run asked for, whatever its status
 * @property {Record<string, string>} metadata
 * @property {string} thread_id
 * @property {string | null} previous_run_id
 * @property {string | null} created_by
 * @property {string} created_at
 */

/**
 * @typedef {object} Approval
 * @property {string} id
 * @property {"action" | "tool_call" | "input"} kind
 * @property {string} action
 * @property {string | null} tool
 * @property {Record<string, unknown> | null} arguments
 * @property {string | null} arguments_sha256
 * @property {Record<string, unknown> | null} edited_arguments
 * @property {boolean} tool_changed
 * @property {string} status
 * @property {string} requested_at
 * @property {string | null} expires_at
 * @property {string | null} auto_approves_at
 * @property {string | null} resolved_by
 * @property {string | null} comment
 * @property {{ rule: string, effect: string, mode: string, version: number } | null} policy
 * @property {import("./answers.js").Schema | null} input_schema
 * @property {unknown} answer
 */

/** @typedef {Approval & { run_id: string, agent: string, run_status: string }} InboxEntry */

/**
 * @typedef {object} RunEvent
 * @property {number} seq
 * @property {string} type
 * @property {string} created_at
 * @property {Record<string, any>} data
 */

/**
 * @template T
 * @typedef {{ data: T[], next_cursor: string | null }} Page
 */

/** @typedef {{ id: string, name: string | null, current: boolean, scopes: string[] }} Key */

/**
 * What the console knows of an agent: whether it wants a second person, or
 * that this is being asked.
 * @typedef {{ separate_approver: boolean } | { pending: true }} AgentAbout
 */

/**
 * @typedef {object} PolicyRule
 * @property {string} id
 * @property {string} agent
 * @property {string} tool
 * @property {string} effect
 * @property {string} [mode]
 * @property {string} [reason]
 * @property {Array<{ path: string, op: string, value: unknown }>} when
 */

/** @typedef {{ version: number | null, updated_at: string, updated_by: string, rules: PolicyRule[] }} Policy */

/**
 * @typedef {object} ApiOptions
 * @property {string} [method]
 * @property {Record<string, string>} [headers]
 * @property {string} [text] the JSON body, as text (an edit's arguments go as typed)
 * @property {AbortSignal} [signal] aborts this request (every request stops with the key in use anyway)
 * @property {boolean} [raw] the Response itself, unread and unchecked
 */

// Where the key is kept: this tab's sessionStorage, never a cookie or URL.
export const KEY = "agent-runs-key";
// The API's base: the page is `<base>/console` (a stage or base path may precede it).
const BASE = location.pathname.replace(/\/console$/, "");

/** An error the API answered; `status` is its HTTP status (when one came). */
export class ApiError extends Error {
  /** @type {number | undefined} */
  status;
}

/**
 * Calls the API with the key in use: the JSON answer (or, `raw`, the
 * Response); an `ApiError` with the API's message when it refused.
 * @param {string} path
 * @param {ApiOptions} [options]
 * @returns {Promise<any>}
 */
export async function api(path, options = {}) {
  const key = sessionStorage.getItem(KEY);
  /** @type {Record<string, string>} */
  const headers = Object.assign({ Authorization: "Bearer " + key }, options.headers || {});
  if (options.text !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(BASE + path, {
    method: options.method || "GET",
    headers,
    body: options.text,
    signal: options.signal ? AbortSignal.any([options.signal, state.session.signal]) : state.session.signal,
  });
  if (options.raw) return response;
  const body = await response.json().catch(/** @returns {null} */ () => null);
  if (!response.ok) {
    const message = body && body.error ? body.error.message : "HTTP " + response.status;
    throw Object.assign(new ApiError(message), { status: response.status });
  }
  return body;
}
