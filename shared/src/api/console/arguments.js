// A tool call's arguments: while a person may decide, one editable view
// (unchanged, Approve approves the call as proposed; changed, it approves
// the edit); otherwise the exact JSON, and after an edit what it changed.
"use strict";

function argumentsText(value) {
  return JSON.stringify(value, null, 2);
}

// What is wrong with edited arguments, or "" when they are a JSON object.
function argumentsProblem(text) {
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    return "Not JSON: " + error.message;
  }
  return parsed && typeof parsed === "object" && !Array.isArray(parsed) ? "" : "The arguments must be a JSON object.";
}

// The lines of `before` and `after`, each marked " ", "-" or "+", keeping
// their longest common run of lines; past a size a table would not be read
// line by line, all of one and then all of the other.
function lineDiff(before, after) {
  const a = before.split("\n");
  const b = after.split("\n");
  if (a.length * b.length > 250000) return [...a.map((line) => ["-", line]), ...b.map((line) => ["+", line])];
  const common = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      common[i][j] = a[i] === b[j] ? common[i + 1][j + 1] + 1 : Math.max(common[i + 1][j], common[i][j + 1]);
    }
  }
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
  return lines;
}

// What an edit changed: the proposed arguments (-) against those approved (+).
function editDiff(proposed, edited) {
  const lines = lineDiff(argumentsText(proposed), argumentsText(edited)).map(([mark, line]) =>
    el("span", { class: { "+": "added", "-": "removed", " ": "same" }[mark] }, mark + " " + line));
  return el("pre", { class: "diff", "aria-label": "the proposed arguments (-) and those approved (+)" }, ...lines);
}

// The one view of a pending call's arguments a person may edit, with what
// is wrong with them; `edited()` says whether they differ from the proposal.
function argumentsEditor(approval) {
  const proposed = argumentsText(approval.arguments);
  const editor = el("textarea", { class: "editor arguments", spellcheck: "false", "aria-label": "arguments (edit to change the call)" });
  // Tall enough to read the call whole (up to 20 lines) without scrolling.
  editor.rows = Math.min(20, Math.max(4, proposed.split("\n").length + 1));
  editor.defaultValue = proposed; // the proposal, kept beside what is typed
  editor.value = proposed;
  const problem = el("div", { class: "invalid", role: "status" });
  const edited = () => editor.value !== editor.defaultValue;
  return { editor, problem, edited };
}
