// The capacity chart, drawn as inline SVG (no chart library): utilisation history, the range
// band (enter thresholds shaded, exit thresholds dashed), the forecast's mean with its 80 % and
// 95 % intervals, "now", and a shadow scale-out's deadline. Hovering shows the values.

import { h, s } from "./dom.js";

const MARGIN = { left: 46, right: 74, top: 14, bottom: 30 };
const MINUTE = 60e3;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const TICK_STEPS = [10 * MINUTE, 30 * MINUTE, HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY,
  14 * DAY, 28 * DAY];
const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const pad = (n) => String(n).padStart(2, "0");

function tickLabel(t, step) {
  const d = new Date(t);
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}`;
  if (step >= DAY) return `${DAYS[d.getDay()]} ${d.getDate()}/${d.getMonth() + 1}`;
  if (d.getHours() === 0 && d.getMinutes() === 0) return `${DAYS[d.getDay()]} ${d.getDate()}/${d.getMonth() + 1}`;
  return hm;
}

function timeTicks(t0, t1, width) {
  const wanted = Math.max(2, Math.floor(width / 90));
  const step = TICK_STEPS.find((st) => (t1 - t0) / st <= wanted) || TICK_STEPS[TICK_STEPS.length - 1];
  // Aligned to local midnight for day steps, to the step otherwise (time zone offset included).
  const offset = new Date(t0).getTimezoneOffset() * MINUTE;
  let t = Math.ceil((t0 - offset) / step) * step + offset;
  if (step >= 7 * DAY) t = Math.ceil((t0 - offset) / DAY) * DAY + offset;
  const out = [];
  for (; t <= t1; t += step) out.push(t);
  return { ticks: out, step };
}

/** Path of a line through [t, v] points, broken where consecutive points are > gap apart. */
function linePath(points, x, y, gap) {
  let d = "";
  let last = null;
  for (const [t, v] of points) {
    if (v === null || v === undefined || Number.isNaN(v)) { last = null; continue; }
    d += `${last === null || t - last > gap ? "M" : "L"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
    last = t;
  }
  return d;
}

function areaPath(points, x, y, lowKey, highKey) {
  if (!points.length) return "";
  const top = points.map((p) => `${x(p.t).toFixed(1)},${y(p[highKey]).toFixed(1)}`);
  const bottom = points.slice().reverse().map((p) => `${x(p.t).toFixed(1)},${y(p[lowKey]).toFixed(1)}`);
  return `M${top.join("L")}L${bottom.join("L")}Z`;
}

function nearest(sorted, t) {
  let lo = 0;
  let hi = sorted.length - 1;
  if (hi < 0) return null;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid].t < t) lo = mid + 1; else hi = mid;
  }
  const a = sorted[Math.max(0, lo - 1)];
  const b = sorted[lo];
  return Math.abs(a.t - t) <= Math.abs(b.t - t) ? a : b;
}

/**
 * Draw into `el` (its current size). data: {history: [{at, util_pct}], resolution_s,
 * band: {low_enter, low_exit, high_enter, high_exit}, forecast: {points} | null,
 * horizonMs, now: Date, proposal: {before, nodes} | null, markers: [{at, label}] (optional),
 * forecastGapMs: the longest step the forecast line bridges (default 2 h; a plan's days: 2 d)}
 */
export function drawCapacityChart(el, data) {
  const width = Math.max(320, el.clientWidth || 800);
  const height = Math.max(200, el.clientHeight || 360);
  const now = data.now.getTime();
  const history = data.history.map((p) => ({ t: new Date(p.at).getTime(), v: p.util_pct }));
  const fcAll = (data.forecast && data.forecast.points ? data.forecast.points : [])
    .map((p) => ({ ...p, t: new Date(p.at).getTime() }));
  const fc = fcAll.filter((p) => p.t <= now + data.horizonMs);

  if (!history.length && !fc.length) {
    el.replaceChildren(h("p", { class: "empty" }, "No utilisation history for this pool yet."));
    return;
  }
  const t0 = Math.min(history.length ? history[0].t : now, now - HOUR);
  const t1 = Math.max(now + (fc.length ? 0 : HOUR / 6), fc.length ? fc[fc.length - 1].t + HOUR : now);
  const peak = Math.max(100, ...history.map((p) => p.v), ...fc.map((p) => p.upper_95));
  const yMax = Math.ceil(peak / 10) * 10;
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const x = (t) => MARGIN.left + ((t - t0) / (t1 - t0)) * plotW;
  const y = (v) => MARGIN.top + (1 - Math.max(0, v) / yMax) * plotH;

  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "pool utilisation history, range band and forecast" });

  // Axes and grid.
  const axis = s("g", { class: "axis" });
  for (let v = 0; v <= yMax; v += yMax > 150 ? 50 : 20) {
    axis.append(s("line", { x1: MARGIN.left, x2: width - MARGIN.right, y1: y(v), y2: y(v) }),
      s("text", { x: MARGIN.left - 6, y: y(v) + 4, "text-anchor": "end" }, `${v}%`));
  }
  const { ticks, step } = timeTicks(t0, t1, plotW);
  for (const t of ticks) {
    axis.append(s("line", { x1: x(t), x2: x(t), y1: MARGIN.top, y2: height - MARGIN.bottom }),
      s("text", { x: x(t), y: height - MARGIN.bottom + 16, "text-anchor": "middle" }, tickLabel(t, step)));
  }
  svg.append(axis);

  // The range: inside the enter thresholds is fine; the exit thresholds end a need.
  const b = data.band;
  const right = width - MARGIN.right;
  svg.append(
    s("rect", { class: "band", x: MARGIN.left, width: plotW, y: y(b.high_enter), height: Math.max(0, y(b.low_enter) - y(b.high_enter)) }),
    s("line", { class: "band-edge", x1: MARGIN.left, x2: right, y1: y(b.high_enter), y2: y(b.high_enter) }),
    s("line", { class: "band-edge", x1: MARGIN.left, x2: right, y1: y(b.low_enter), y2: y(b.low_enter) }),
    s("line", { class: "band-exit", x1: MARGIN.left, x2: right, y1: y(b.high_exit), y2: y(b.high_exit) }),
    s("line", { class: "band-exit", x1: MARGIN.left, x2: right, y1: y(b.low_exit), y2: y(b.low_exit) }),
    s("text", { class: "band-label", x: right + 4, y: y(b.high_enter) + 4 }, `${b.high_enter}% out`),
    s("text", { class: "band-label", x: right + 4, y: y(b.high_exit) + 8 }, `${b.high_exit}% exit`),
    s("text", { class: "band-label", x: right + 4, y: y(b.low_exit) - 1 }, `${b.low_exit}% exit`),
    s("text", { class: "band-label", x: right + 4, y: y(b.low_enter) + 9 }, `${b.low_enter}% in`),
  );

  // Forecast intervals under the lines.
  if (fc.length) {
    svg.append(
      s("path", { class: "fc-95", d: areaPath(fc, x, y, "lower_95", "upper_95") }),
      s("path", { class: "fc-80", d: areaPath(fc, x, y, "lower_80", "upper_80") }),
      s("path", { class: "fc-mean", d: linePath(fc.map((p) => [p.t, p.mean]), x, y, data.forecastGapMs || 2 * HOUR) }),
    );
  }
  const gap = Math.max(3 * (data.resolution_s || 60) * 1000, 2 * MINUTE);
  svg.append(s("path", { class: "history", d: linePath(history.map((p) => [p.t, p.v]), x, y, gap) }));

  svg.append(
    s("line", { class: "now", x1: x(now), x2: x(now), y1: MARGIN.top, y2: height - MARGIN.bottom }),
    s("text", { class: "now-label", x: x(now) + 4, y: MARGIN.top + 10 }, "now"),
  );
  if (data.proposal) {
    const t = new Date(data.proposal.before).getTime();
    if (t >= t0 && t <= t1) {
      svg.append(
        s("line", { class: "proposal", x1: x(t), x2: x(t), y1: MARGIN.top, y2: height - MARGIN.bottom }),
        s("text", { class: "proposal-label", x: x(t) + 4, y: MARGIN.top + 24 }, `shadow: +${data.proposal.nodes} node${data.proposal.nodes === 1 ? "" : "s"} before`),
      );
    }
  }

  for (const [i, m] of (data.markers || []).entries()) {
    const t = new Date(m.at).getTime();
    if (t < t0 || t > t1) continue;
    svg.append(
      s("line", { class: "proposal", x1: x(t), x2: x(t), y1: MARGIN.top, y2: height - MARGIN.bottom }),
      s("text", { class: "proposal-label", x: x(t) + 4, y: MARGIN.top + 24 + 12 * i }, m.label),
    );
  }

  // Hover: the nearest history point or forecast hour.
  const cross = s("line", { class: "cross", y1: MARGIN.top, y2: height - MARGIN.bottom, visibility: "hidden" });
  const tip = h("div", { class: "tooltip", hidden: true });
  const overlay = s("rect", { x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH, fill: "transparent" });
  overlay.addEventListener("mousemove", (ev) => {
    const box = svg.getBoundingClientRect();
    const px = ev.clientX - box.left;
    const t = t0 + ((px - MARGIN.left) / plotW) * (t1 - t0);
    const when = new Date(t);
    let text;
    if (t > now && fc.length) {
      const p = nearest(fc, t);
      text = `${new Date(p.t).toLocaleString()} forecast ${p.mean.toFixed(1)}% (80%: ${p.lower_80.toFixed(0)}–${p.upper_80.toFixed(0)}, 95%: ${p.lower_95.toFixed(0)}–${p.upper_95.toFixed(0)})`;
    } else if (history.length) {
      const p = nearest(history, t);
      text = `${new Date(p.t).toLocaleString()} ${p.v.toFixed(1)}%`;
    } else {
      text = when.toLocaleString();
    }
    cross.setAttribute("x1", px);
    cross.setAttribute("x2", px);
    cross.setAttribute("visibility", "visible");
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = `${Math.min(px + 10, width - 330)}px`;
    tip.style.top = `${MARGIN.top + 4}px`;
  });
  overlay.addEventListener("mouseleave", () => {
    cross.setAttribute("visibility", "hidden");
    tip.hidden = true;
  });
  svg.append(cross, overlay);
  el.replaceChildren(svg, tip);
}
