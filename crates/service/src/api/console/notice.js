// @ts-check
// The banner: what went wrong, or a confirmation of what was done.
import { ApiError } from "./api.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

/**
 * Shows `message` in the banner (nothing: hides it). An error stays until
 * something succeeds or another error replaces it; a confirmation (`ok`)
 * leaves by itself after a few seconds.
 * @param {string} message
 * @param {boolean} [ok]
 */
export function notice(message, ok) {
  state.listError = false;
  const box = $("notice");
  box.textContent = message || "";
  box.hidden = !message;
  box.className = ok ? "ok" : "";
  clearTimeout(state.noticeTimer);
  if (ok && message) state.noticeTimer = setTimeout(() => { if (box.textContent === message) notice(""); }, 6000);
}

/**
 * An error for the person; `fromList`: the banner a later list clears.
 * @param {Error} error
 * @param {boolean} [fromList]
 */
export function failed(error, fromList) {
  if (error.name === "AbortError") return; // asked with a key no longer in use
  notice(error instanceof ApiError ? error.message : "The API could not be reached: " + error.message);
  state.listError = Boolean(fromList);
}
