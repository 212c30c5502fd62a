// @ts-check
// The Policy tab: the owner's approval policy, read only, each rule and
// when it applies. It takes the list pane's place.
import { api } from "./api.js";
import { el, $ } from "./dom.js";
import { failed } from "./notice.js";
import { state } from "./state.js";

/** @typedef {import("./api.js").Policy} Policy */

export async function loadPolicy() {
  try {
    /** @type {Policy} */
    const policy = await api("/v1/policies");
    state.items = [];
    state.cursor = null;
    const list = $("list");
    list.replaceChildren(
      el("li", { class: "meta" }, policy.version
        ? "Policy version " + policy.version + " · put " + policy.updated_at + " by " + policy.updated_by
        : "No policy: each tool's own setting decides which calls need a person."),
    );
    for (const rule of policy.rules) {
      const conditions = rule.when.map((c) => el("div", { class: "meta" }, "when " + c.path + " " + c.op + " " + JSON.stringify(c.value)));
      list.append(el(
        "li",
        { class: "rule" },
        el("div", {}, el("strong", {}, rule.id), " " + rule.effect + (rule.mode === "log_only" ? " (log only)" : "")),
        el("div", { class: "meta" }, "agent " + rule.agent + " · tool " + rule.tool),
        ...conditions,
        rule.reason ? el("div", { class: "meta" }, "reason: " + rule.reason) : null,
      ));
    }
    $("more").hidden = true;
  } catch (error) {
    failed(error);
  }
}
