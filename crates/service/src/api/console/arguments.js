// @ts-check
// A tool call's arguments: while a person may decide, one editable view
// (unchanged, Approve approves the call as proposed; changed, it approves
// the edit); otherwise the exact JSON, and after an edit what it changed.
import { el } from "./dom.js";
import { state } from "./state.js";

/**
 * Arguments as a person reads them: JSON, two spaces deep.
 * @param {unknown} value
 */
export function argumentsText(value) {
  return JSON.stringify(value, null, 2);
}

/**
 * What is wrong with edited arguments, or "" when they are a JSON object.
 * @param {string} text
 */
export function argumentsProblem(text) {
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    return "Not JSON: " + error.message;
  }
  return parsed && typeof parsed === "object" && !Array.isArray(parsed) ? "" : "The arguments must be a JSON object.";
}

/**
 * JSON text without the whitespace between its tokens: two texts that
 * differ only in layout are the same call.
 * @param {string} text
 */
export function withoutLayout(text) {
  let out = "";
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      out += c;
      if (c === "\\") out += text[++i] || "";
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
      out += c;
    } else if (!" \t\n\r".includes(c)) {
      out += c;
    }
  }
  return out;
}

/**
 * The lines of `before` and `after`, each marked " ", "-" or "+": the lines
 * both start and end with, and between them their longest common run of
 * lines (past a size, all of one and then all of the other).
 * @param {string} before
 * @param {string} after
 * @returns {Array<[string, string]>}
 */
function lineDiff(before, after) {
  let a = before.split("\n");
  let b = after.split("\n");
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  /**
   * @param {string} mark
   * @param {string[]} lines
   * @returns {Array<[string, string]>}
   */
  const marked = (mark, lines) => lines.map((line) => [mark, line]);
  const [start, end] = [marked(" ", a.slice(0, head)), marked(" ", a.slice(a.length - tail))];
  a = a.slice(head, a.length - tail);
  b = b.slice(head, b.length - tail);
  if (a.length * b.length > 250000) return [...start, ...marked("-", a), ...marked("+", b), ...end];
  const common = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
  /** @type {Array<[string, string]>} */
  const lines = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) {
      lines.push([" ", a[i++]]);
      j++;
    } else if (i < a.length && (j === b.length || common[i + 1][j] >= common[i][j + 1])) {
      lines.push(["-", a[i++]]);
    } else {
      lines.push(["+", b[j++]]);
    }
  }
  return [...start, ...lines, ...end];
}

/**
 * What an edit changed: the proposed arguments (-) against those approved (+).
 * @param {unknown} proposed
 * @param {unknown} edited
 */
export function editDiff(proposed, edited) {
  const lines = lineDiff(argumentsText(proposed), argumentsText(edited)).map(([mark, line]) =>
    el("span", { class: { "+": "added", "-": "removed", " ": "same" }[mark] }, mark + " " + line));
  return el("pre", { class: "diff", "aria-label": "the proposed arguments (-) and those approved (+)" }, ...lines);
}

/**
 * The one view of a pending call's arguments a person may edit, with what
 * is wrong with them; `edited(text)` says whether a text is another call
 * than the proposal (not merely laid out otherwise). What is typed is kept
 * as a draft, so a re-render of the run does not lose it.
 * @param {import("./api.js").Approval} approval
 */
export function argumentsEditor(approval) {
  const proposed = argumentsText(approval.arguments);
  const editor = el("textarea", { class: "editor arguments", spellcheck: "false", "aria-label": "arguments (edit to change the call)" });
  // Tall enough to read the call whole (up to 20 lines) without scrolling.
  editor.rows = Math.min(20, Math.max(4, proposed.split("\n").length + 1));
  editor.defaultValue = proposed; // the proposal, kept beside what is typed
  editor.value = state.drafts.get(approval.id) ?? proposed;
  editor.addEventListener("input", () => state.drafts.set(approval.id, editor.value));
  const problem = el("div", { class: "invalid", role: "status" });
  /** @param {string} text */
  const edited = (text) => withoutLayout(text) !== withoutLayout(proposed);
  return { editor, problem, edited };
}
