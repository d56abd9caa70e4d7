// Small DOM helpers. Every value from the API goes in as text (textContent), never as HTML,
// so a task reason or a node name cannot inject markup into the page.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "style") Object.assign(el.style, value); // CSSOM: allowed by the page's CSP
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** h("a", {href: "#/x", class: "y"}, "text", otherNode) */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function badge(state, extra) {
  return h("span", { class: ["badge", state], "data-state": state }, extra ?? state);
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "—";
}

const pad = (n) => String(n).padStart(2, "0");

/** "2024-05-01 14:03:07" in the browser's time zone. */
export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function fmtAgo(iso) {
  if (!iso) return "—";
  const seconds = (Date.now() - new Date(iso).getTime()) / 1000;
  if (seconds < 0) return "just now";
  return `${fmtDuration(seconds)} ago`;
}

export function since(startIso, endIso) {
  if (!startIso) return null;
  const end = endIso ? new Date(endIso).getTime() : Date.now();
  return (end - new Date(startIso).getTime()) / 1000;
}

export function fmtPct(value, digits = 0) {
  return value === null || value === undefined ? "—" : `${Number(value).toFixed(digits)}%`;
}

/** A JSON value as short text for a table cell. */
export function fmtValue(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

/** A <dl> of key/value pairs (skipping undefined values). */
export function kv(pairs, cls = "kv") {
  const dl = h("dl", { class: cls });
  for (const [key, value] of pairs) {
    if (value === undefined) continue;
    dl.append(h("dt", {}, key), h("dd", {}, value instanceof Node ? value : fmtValue(value)));
  }
  return dl;
}

/** ISO 8601 durations as pydantic writes them ("P1D", "PT24H", "P7D") in seconds. */
export function isoDurationSeconds(text) {
  const m = /^P(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$/.exec(String(text));
  if (!m) return Number(text) || null;
  const [, w, d, hh, mm, ss] = m.map((v) => (v === undefined ? 0 : Number(v)));
  return (((w * 7 + d) * 24 + hh) * 60 + mm) * 60 + ss;
}

export function fmtHorizon(text) {
  const seconds = isoDurationSeconds(text);
  if (!seconds) return String(text);
  if (seconds % 604800 === 0) return seconds === 604800 ? "next week" : `next ${seconds / 604800} weeks`;
  if (seconds % 86400 === 0) return seconds === 86400 ? "next day" : `next ${seconds / 86400} days`;
  return `next ${fmtDuration(seconds)}`;
}

/**
 * A paged list's "1–50 of 120" and its two buttons: a click moves `filters.offset` by `size`
 * and calls `moved()`; `show(page)` sets the range and the buttons from a page of the API.
 */
export function pager(filters, size, moved, [back, forward] = ["‹ Newer", "Older ›"]) {
  const range = h("span", { class: "muted" });
  const prev = h("button", { type: "button", class: "secondary small", onclick: () => {
    filters.offset = Math.max(0, filters.offset - size);
    moved();
  } }, back);
  const next = h("button", { type: "button", class: "secondary small", onclick: () => {
    filters.offset += size;
    moved();
  } }, forward);
  return {
    el: h("div", { class: "pager" }, range, prev, next),
    show(page) {
      const first = page.total ? page.offset + 1 : 0;
      range.textContent = `${first}–${page.offset + page.items.length} of ${page.total}`;
      prev.disabled = page.offset === 0;
      next.disabled = page.offset + page.items.length >= page.total;
    },
  };
}
