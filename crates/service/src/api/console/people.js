// @ts-check
// Who is who: the owner's keys by name (who created a run, who decided),
// the key in use and what it may do, and whether a run's agent wants its
// approvals decided by another key than the one that created the run.
import { api } from "./api.js";
import { renderRun } from "./detail.js";
import { el } from "./dom.js";
import { failed } from "./notice.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Key} Key */
/** @typedef {import("./api.js").Run} Run */

/**
 * Reads the owner's keys: `keys` (id → key) and `me` (the key in use), for
 * `state`. What the key may do comes from its own scopes.
 */
export async function loadKeys() {
  /** @type {Key[]} */
  const keys = (await api("/v1/keys")).data;
  const me = keys.find((key) => key.current);
  const scopes = new Set(me ? me.scopes : []);
  return {
    keys: new Map(keys.map((key) => [key.id, key])),
    me: me ? me.id : null,
    canDecide: scopes.has("approvals:decide"),
    canCreate: scopes.has("runs:write"),
  };
}

/**
 * A key as a person knows it: its name (the id on hover), "you" for the
 * key in use; the id when it has no name or is not the owner's any more.
 * @param {string} keyId
 */
export function who(keyId) {
  const key = state.keys.get(keyId);
  const name = key && key.name ? key.name : keyId;
  const label = keyId === state.me ? name + " (you)" : name;
  return el("span", { class: key && key.name ? "who" : "who id", title: keyId }, label);
}

/**
 * What decided an approval: a key, a policy rule or a veto window's end.
 * @param {string} resolvedBy
 * @returns {Node | string}
 */
export function decider(resolvedBy) {
  if (resolvedBy.startsWith("key_")) return who(resolvedBy);
  if (resolvedBy === "timeout") return "the veto window's end (nobody objected)";
  return resolvedBy;
}

/**
 * Whether the key in use may not decide this run's approvals because its
 * agent wants a second person: `undefined` while that is being asked.
 * @param {Run} run
 * @returns {boolean | undefined}
 */
export function secondPersonNeeded(run) {
  if (!run.created_by || run.created_by !== state.me) return false;
  const agent = state.agents.get(run.agent);
  if (agent && "separate_approver" in agent) return agent.separate_approver;
  if (!agent) {
    state.agents.set(run.agent, { pending: true });
    const session = state.session;
    api("/v1/agents/" + encodeURIComponent(run.agent)).catch((error) => {
      // No longer defined (404) needs nobody; on any other failure the
      // buttons are offered and the API still refuses what it must.
      if (error.status !== 404) failed(error);
      return { separate_approver: false };
    }).then((about) => {
      if (session !== state.session) return; // another key, or Forget, since
      state.agents.set(run.agent, about);
      // The run shown now, as last drawn, if it is of this agent.
      if (state.run && state.run.id === state.runId && state.run.agent === run.agent) {
        state.shown = "";
        renderRun(state.run);
      }
    });
  }
  return undefined;
}
