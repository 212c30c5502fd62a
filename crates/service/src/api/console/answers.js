// @ts-check
// The form a person answers a question with, built from the question's
// JSON Schema: a string (a text area when it may be long), a number, an
// integer, a boolean, a choice among an `enum` of those, or an object of
// those;
// raw JSON otherwise. The service checks the answer against the whole
// schema; this checks what the form can, before sending.
import { el } from "./dom.js";

/**
 * A JSON Schema, as far as the form reads it.
 * @typedef {object} Schema
 * @property {string} [type]
 * @property {unknown[]} [enum]
 * @property {string} [description]
 * @property {number} [minLength]
 * @property {number} [maxLength]
 * @property {number} [minimum]
 * @property {number} [maximum]
 * @property {Record<string, Schema>} [properties]
 * @property {string[]} [required]
 */

/**
 * What a field holds: its `value`, `skip` (left empty, not required), or
 * the `problem` with it.
 * @typedef {{ value?: unknown, skip?: boolean, problem?: string }} FieldRead
 */

/**
 * What the form holds: the `answer`, or the JSON `text` of one as typed,
 * or the `problem` with it.
 * @typedef {{ answer?: unknown, text?: string, problem?: string }} FormRead
 */

/** @typedef {{ element: HTMLElement, read: () => FieldRead }} AnswerField */
/** @typedef {{ element: HTMLElement, read: () => FormRead, raw?: boolean }} AnswerForm */

/**
 * What the form can show as one field of `schema`, or null.
 * @param {Schema} schema
 */
function fieldKind(schema) {
  if (!schema || typeof schema !== "object") return null;
  /** @param {unknown} value */
  const scalar = (value) => ["string", "number", "boolean"].includes(typeof value);
  if (Array.isArray(schema.enum) && schema.enum.length && schema.enum.every(scalar)) return "choice";
  if (schema.type === "string") return schema.maxLength > 200 ? "long" : "text";
  if (schema.type === "number" || schema.type === "integer" || schema.type === "boolean") return schema.type;
  return null;
}

/**
 * A field for `schema` named `label`: its element, and read() giving
 * { value } or { problem }.
 * @param {Schema} schema
 * @param {string} label
 * @param {boolean} required
 * @returns {AnswerField}
 */
function answerField(schema, label, required) {
  const kind = fieldKind(schema);
  const id = "answer-" + Math.random().toString(36).slice(2);
  /** @type {HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement} */
  let input;
  if (kind === "choice") {
    input = el("select", { id });
    if (!required) input.append(el("option", { value: "" }, "—"));
    // Each option names its place in the enum, whose value (a string, a
    // number or a boolean) is sent as it is; shown as JSON where its text
    // alone could be taken for another option's.
    const mixed = new Set(schema.enum.map((option) => typeof option)).size > 1;
    /** @param {unknown} option */
    const label = (option) => (mixed || option === "" ? JSON.stringify(option) : String(option));
    schema.enum.forEach((option, index) => input.append(el("option", { value: String(index) }, label(option))));
  } else if (kind === "long") {
    input = el("textarea", { id, class: "answer-text" });
  } else if (kind === "boolean") {
    input = el("input", { id, type: "checkbox" });
  } else if (kind === "number" || kind === "integer") {
    input = el("input", { id, type: "number", step: kind === "integer" ? "1" : "any" });
  } else {
    input = el("input", { id, type: "text" });
  }
  const read = () => {
    if (kind === "boolean") return { value: /** @type {HTMLInputElement} */ (input).checked };
    const text = input.value;
    if (kind === "choice" && text !== "") return { value: schema.enum[Number(text)] };
    if (text === "") return required ? { problem: label + " is required." } : { skip: true };
    if (kind === "number" || kind === "integer") {
      const number = Number(text);
      if (!Number.isFinite(number)) return { problem: label + " must be a number." };
      if (kind === "integer" && !Number.isInteger(number)) return { problem: label + " must be a whole number." };
      if (schema.minimum !== undefined && number < schema.minimum) return { problem: label + " must be at least " + schema.minimum + "." };
      if (schema.maximum !== undefined && number > schema.maximum) return { problem: label + " must be at most " + schema.maximum + "." };
      return { value: number };
    }
    if (schema.minLength !== undefined && text.length < schema.minLength) return { problem: label + " must be at least " + schema.minLength + " characters." };
    if (schema.maxLength !== undefined && text.length > schema.maxLength) return { problem: label + " must be at most " + schema.maxLength + " characters." };
    // A `pattern` is left to the service: the agent wrote it, and a
    // backtracking regex could hang this tab.
    return { value: text };
  };
  const row = el("label", { class: "answer-field", for: id }, el("span", {}, label + (schema.description ? " — " + schema.description : "")), input);
  return { element: row, read };
}

/**
 * The form for `schema`: { element, read() } where read() gives
 * { answer } (or its JSON `text`) or { problem }.
 * @param {Schema} schema
 * @returns {AnswerForm}
 */
export function answerForm(schema) {
  const box = el("div", { class: "answer-form" });
  if (fieldKind(schema)) {
    const field = answerField(schema, "Answer", true);
    box.append(field.element);
    return { element: box, read: () => { const got = field.read(); return got.problem ? got : { answer: got.value }; } };
  }
  const properties = schema && schema.type === "object" && schema.properties;
  if (properties && Object.values(properties).every(fieldKind)) {
    const required = Array.isArray(schema.required) ? schema.required : [];
    /** @type {Array<[string, AnswerField]>} */
    const fields = Object.entries(properties).map(([name, property]) => [name, answerField(property, name, required.includes(name))]);
    for (const [, field] of fields) box.append(field.element);
    return {
      element: box,
      read: () => {
        /** @type {Record<string, unknown>} */
        const answer = {};
        for (const [name, field] of fields) {
          const got = field.read();
          if (got.problem) return got;
          if (!got.skip) answer[name] = got.value;
        }
        return { answer };
      },
    };
  }
  // Raw JSON, sent as typed (see the edit of arguments).
  const raw = el("textarea", { class: "answer-json", spellcheck: "false", "aria-label": "answer as JSON" });
  box.append(el("div", { class: "meta" }, "Answer as JSON, matching:"), el("pre", {}, JSON.stringify(schema, null, 2)), raw);
  return {
    element: box,
    raw: true,
    read: () => {
      try {
        JSON.parse(raw.value);
      } catch (error) {
        return { problem: "Not JSON: " + error.message };
      }
      return { text: raw.value };
    },
  };
}
