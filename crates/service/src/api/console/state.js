// @ts-check
// What the console knows and shows now, in one object every module imports:
// `reset()` (console.js) empties it before another key is used.

/** @typedef {import("./api.js").Run} Run */
/** @typedef {import("./api.js").InboxEntry} InboxEntry */
/** @typedef {import("./api.js").RunEvent} RunEvent */
/** @typedef {import("./api.js").Key} Key */
/** @typedef {import("./api.js").AgentAbout} AgentAbout */

/** @typedef {"inbox" | "runs" | "policy"} View */

export const state = {
  /** @type {View} */
  view: "inbox",
  /** @type {Array<InboxEntry | Run>} the list's entries: approvals in the inbox, runs in Runs */
  items: [],
  selected: -1,
  /** @type {string | null} */
  cursor: null,
  cursorUsed: false, // whether the list holds a page the person loaded with More
  /** @type {string | null} */
  runId: null, // the run shown (or being loaded)
  /** @type {string | null} */
  approvalId: null, // the approval the person picked in the inbox or clicked: the one a and r decide
  shown: "", // the signature of what the detail shows
  renderedAt: 0,
  /** @type {AbortController | null} */
  follow: null, // aborts the events loop of the shown run
  /** @type {RunEvent[]} */
  events: [], // the shown run's events so far
  canDecide: true, // whether the key may decide (approvals:decide)
  canCreate: true, // whether the key may create runs (runs:write), to continue one
  /** @type {Run | null} */
  run: null, // the shown run as last drawn
  /** @type {Map<string, Key>} */
  keys: new Map(), // the owner's keys by id: names of who created and who decided
  /** @type {string | null} */
  me: null, // the id of the key in use
  /** @type {Map<string, AgentAbout>} */
  agents: new Map(), // what GET /v1/agents/{agent} said, by agent name
  /** @type {ReturnType<typeof setInterval> | null} */
  poll: null, // the timer that refreshes the list
  session: new AbortController(), // aborts every request of the key in use
  listSeq: 0, // the latest list request: an older answer is dropped
  listError: false, // whether the banner is a list's error (a later list clears it)
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  noticeTimer: undefined, // takes a confirmation off the banner
  /** @type {(() => void) | null} */
  closeConfirm: null, // closes the open confirmation
  /** @type {string | null} */
  scrollToDetail: null, // a run tapped on a phone: its detail is scrolled to once drawn
  /** @type {Map<string, string>} */
  drafts: new Map(), // what a person typed into a pending call's arguments (or comment), by approval id
};
