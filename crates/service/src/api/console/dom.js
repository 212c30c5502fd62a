// @ts-check
// Building the page: its elements by id, new elements whose every text is
// set as text (never parsed as HTML), and the times and statuses every view
// shows.

/**
 * The page's element with this id.
 * @param {string} id
 * @returns {HTMLElement}
 */
export const $ = (id) => document.getElementById(id);

/**
 * A new element: `props` are its attributes, except `class` and the `on…`
 * listeners; `children` are nodes or text (null and undefined left out).
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Record<string, any> | null} [props]
 * @param {...(Node | string | number | null | undefined)} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/**
 * A time as "3m ago" (or "in 3m"), with the exact time on hover.
 * @param {string} iso
 */
export function when(iso) {
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return el("time", { datetime: iso, title: iso }, seconds >= 0 ? duration(seconds) + " ago" : "in " + duration(-seconds));
}

/**
 * How long ago (or how long until) a time is, as "3m".
 * @param {string} iso
 */
export function ago(iso) {
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return duration(Math.abs(seconds));
}

/** @param {number} seconds */
export function duration(seconds) {
  if (seconds < 90) return seconds + "s";
  if (seconds < 5400) return Math.round(seconds / 60) + "m";
  if (seconds < 172800) return Math.round(seconds / 3600) + "h";
  return Math.round(seconds / 86400) + "d";
}

/**
 * A run's or an approval's status, styled by its name.
 * @param {string} name
 */
export function status(name) {
  return el("span", { class: "status " + name }, name);
}
