// @ts-check
// The list pane the inbox and the runs share: a page of either (the policy
// draws its own), the entry picked and its run shown, and the list read
// again now and then.
import { api } from "./api.js";
import { markCurrent, showRun } from "./detail.js";
import { el, $ } from "./dom.js";
import { inboxEntry, inboxQuery } from "./inbox.js";
import { failed, notice } from "./notice.js";
import { loadPolicy } from "./policy.js";
import { runEntry, runsQuery } from "./runs.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Run} Run */
/** @typedef {import("./api.js").InboxEntry} InboxEntry */

/**
 * Loads the list (or its next page, `more`); the first entry is opened
 * unless the person is looking at a run (`keep`), as after a decision.
 * @param {boolean} [more]
 * @param {boolean} [keep]
 */
export async function loadList(more, keep) {
  if (state.view === "policy") return loadPolicy();
  const { path, params } = state.view === "inbox" ? inboxQuery() : runsQuery();
  params.set("limit", "20");
  if (more && state.cursor) params.set("cursor", state.cursor);
  state.cursorUsed = Boolean(more);
  const seq = ++state.listSeq;
  const view = state.view;
  try {
    /** @type {import("./api.js").Page<InboxEntry | Run>} */
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

function renderList() {
  const list = $("list");
  list.replaceChildren();
  state.items.forEach((item, index) => {
    const entry = state.view === "inbox"
      ? inboxEntry(/** @type {InboxEntry} */ (item))
      : runEntry(/** @type {Run} */ (item));
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

/**
 * The run an entry is of: an approval's run, or the run itself.
 * @param {{ id: string, run_id?: string }} item
 */
function runIdOf(item) {
  return item.run_id || item.id;
}

/**
 * Picks the list's entry at `index` and shows its run.
 * @param {number} index
 */
export function select(index) {
  if (index < 0 || index >= state.items.length) return;
  state.selected = index;
  for (const node of /** @type {HTMLCollectionOf<HTMLElement>} */ ($("list").children)) {
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
export async function advance() {
  const at = Math.max(state.selected, 0);
  await loadList(false, true);
  if (state.items.length) select(Math.min(at, state.items.length - 1));
}

// The list again now and then, keeping what is selected, unless the person
// is typing or a confirmation is open.
export function refreshNowAndThen() {
  clearInterval(state.poll);
  state.poll = setInterval(() => {
    const busy = ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName) || !$("confirm").hidden;
    // Not over pages the person loaded with More (only the first is read again).
    if (!busy && !$("app").hidden && state.view !== "policy" && !state.cursorUsed) loadList(false, true);
  }, 10000);
}
