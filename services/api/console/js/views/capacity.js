// Capacity: a pool's utilisation history with the range band and the forecast
// (GET /api/v1/capacity), and the capacity report read from it: when the range will be left,
// nodes needed, a shadow scale-out (recorded, never acted on) and never a scale-in; below
// them the pool's capacity plan for procurement (views/plan.js).

import { get, withQuery } from "../api.js";
import { drawCapacityChart } from "../chart.js";
import { fmtHorizon, fmtPct, fmtTime, h, kv } from "../dom.js";
import { poller } from "../poll.js";
import { replaceParams } from "../router.js";
import { planSection } from "./plan.js";

const POLL_MS = 30000;
const SPANS = {
  hour: { label: "last hour (10 s)", resolution: 10, points: 360 },
  day: { label: "last day (1 min)", resolution: 60, points: 1440 },
  week: { label: "last week (1 min)", resolution: 60, points: 10080 },
  weeks: { label: "last 8 weeks (1 h)", resolution: 3600, points: 1344 },
};
const HORIZONS = { day: ["next day", 86400e3], week: ["next week", 7 * 86400e3] };

function exitText(exit) {
  if (!exit) return "stays inside";
  return `${fmtTime(exit.at)} (${exit.basis.replace("_", " ")} ${fmtPct(exit.value, 1)})`;
}

function peakText(peak) {
  return peak ? `${fmtPct(peak.value, 1)} at ${fmtTime(peak.at)}` : "—";
}

function reportPanel(data) {
  const parts = [];
  if (data.forecast_error) {
    parts.push(h("p", { class: "notice", "data-testid": "forecast-error" }, `No forecast: ${data.forecast_error}`));
  }
  const f = data.forecast;
  if (f) {
    parts.push(kv([
      ["Model", `${f.model}${f.model_detail ? ` — ${f.model_detail}` : ""}`],
      ["History used", `${f.history_hours} h${f.history_from ? ` from ${fmtTime(f.history_from)}` : ""}${f.filled_hours ? `, ${f.filled_hours} h interpolated` : ""}`],
      ["Hold-out error", Object.keys(f.holdout_mae || {}).length
        ? Object.entries(f.holdout_mae).map(([k, v]) => `${k} ${v.toFixed(1)} pts`).join(", ") : "—"],
      ["Generated", fmtTime(f.generated_at)],
    ]));
    if (f.notes && f.notes.length) parts.push(h("ul", { class: "muted" }, f.notes.map((n) => h("li", {}, n))));
  }
  const r = data.capacity_report;
  if (r) {
    parts.push(h("h3", {}, `Capacity: ${r.nodes_now} node${r.nodes_now === 1 ? "" : "s"} now (${r.capacity_now} GPUs, ${r.per_node_capacity.toFixed(1)} per node)`));
    parts.push(h("div", { class: "report-windows" }, r.windows.map((w) => h("div", { class: "panel" },
      h("h3", {}, `${fmtHorizon(w.horizon)} (${w.hours} h)`),
      kv([
        ["Peak (mean)", peakText(w.peak_mean)],
        ["Peak (80% upper)", peakText(w.peak_upper_80)],
        ["Above the range", exitText(w.first_above_mean)],
        ["Above (80% upper)", exitText(w.first_above_upper_80)],
        ["Below the range", exitText(w.first_below_mean)],
        ["Nodes needed", w.nodes_needed_mean === null ? "—"
          : `${w.nodes_needed_mean} (mean)${w.nodes_needed_upper_80 !== null ? `, ${w.nodes_needed_upper_80} (80% upper)` : ""}`],
      ], "kv compact")))));
    if (r.proposal) {
      const p = r.proposal;
      parts.push(h("div", { class: "proposal-box", "data-testid": "proposal" },
        h("b", {}, `Shadow proposal: scale out by ${p.nodes} node${p.nodes === 1 ? "" : "s"} before ${fmtTime(p.before)}`),
        h("div", {}, `${p.nodes_now} → ${p.nodes_after} nodes; peak ${fmtPct(p.peak_pct, 1)} at ${fmtTime(p.peak_at)} becomes ${fmtPct(p.peak_after_pct, 1)}. ${p.reason}`),
        h("div", { class: "muted" }, "Recorded, not acted on.")));
    } else {
      parts.push(h("p", {}, h("b", {}, "No scale-out proposed: "), r.proposal_reason));
    }
    parts.push(h("p", { class: "muted" }, h("b", {}, "Scale-in: "), r.scale_in_reason));
  }
  return parts;
}

export function capacityView(container, { params, live }) {
  const state = {
    cluster: params.get("cluster") || "",
    pool: params.get("pool") || "",
    span: SPANS[params.get("span")] ? params.get("span") : "day",
    horizon: HORIZONS[params.get("horizon")] ? params.get("horizon") : "day",
  };
  const clusterSelect = h("select", { name: "cluster" });
  const poolSelect = h("select", { name: "pool" });
  const spanSelect = h("select", { name: "span" }, Object.entries(SPANS).map(([k, v]) => h("option", { value: k }, v.label)));
  const horizonSelect = h("select", { name: "horizon" }, Object.entries(HORIZONS).map(([k, [label]]) => h("option", { value: k }, label)));
  spanSelect.value = state.span;
  horizonSelect.value = state.horizon;
  const chart = h("div", { class: "chart", "data-testid": "capacity-chart" });
  const summary = h("div", { class: "page-head" });
  const report = h("div", {});
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const plan = planSection();

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Capacity"),
      h("span", { class: "sub" }, "utilisation history, the range band and the forecast")),
    h("form", { class: "filters panel", onsubmit: (ev) => ev.preventDefault() },
      h("label", {}, "Cluster", clusterSelect), h("label", {}, "Pool", poolSelect),
      h("label", {}, "History", spanSelect), h("label", {}, "Forecast", horizonSelect)),
    error,
    h("section", { class: "panel" }, summary, chart,
      h("div", { class: "chart-legend" },
        h("span", {}, h("i", { class: "history" }), "utilisation"),
        h("span", {}, h("i", { class: "band" }), "range (scale need enters outside; dashed: exit)"),
        h("span", {}, h("i", { class: "fc-mean" }), "forecast mean"),
        h("span", {}, h("i", { class: "fc-80" }), "80% interval"),
        h("span", {}, h("i", { class: "fc-95" }), "95% interval"))),
    h("section", { class: "panel" }, h("h2", {}, "Forecast and capacity report"), report),
    plan.element);

  let clusters = [];
  let last = null;

  function fillPools() {
    const c = clusters.find((x) => x.cluster === state.cluster);
    const pools = c && c.pools.length ? c.pools.map((p) => p.pool) : [state.pool || "default"];
    if (!pools.includes(state.pool)) state.pool = pools[0];
    poolSelect.replaceChildren(...pools.map((p) => h("option", { value: p }, p)));
    poolSelect.value = state.pool;
  }

  function changed() {
    state.cluster = clusterSelect.value;
    fillPools();
    state.pool = poolSelect.value;
    state.span = spanSelect.value;
    state.horizon = horizonSelect.value;
    replaceParams("capacity", state);
    poll.refresh();
  }
  clusterSelect.addEventListener("change", changed);
  poolSelect.addEventListener("change", () => { state.pool = poolSelect.value; changed(); });
  spanSelect.addEventListener("change", changed);
  horizonSelect.addEventListener("change", () => { state.horizon = horizonSelect.value; replaceParams("capacity", state); draw(); });

  function draw() {
    if (!last) return;
    drawCapacityChart(chart, {
      history: last.history, resolution_s: last.resolution_s, band: last.band,
      forecast: last.forecast, horizonMs: HORIZONS[state.horizon][1], now: new Date(last.generated_at),
      proposal: last.capacity_report && last.capacity_report.proposal,
    });
  }
  const onResize = () => { draw(); plan.draw(); };
  window.addEventListener("resize", onResize);

  const poll = poller(async (signal) => {
    if (!clusters.length) {
      clusters = (await get("/api/v1/clusters", { signal })).clusters || [];
      if (!state.cluster && clusters.length) state.cluster = clusters[0].cluster;
      clusterSelect.replaceChildren(...clusters.map((c) => h("option", { value: c.cluster }, c.cluster)));
      if (state.cluster && !clusters.some((c) => c.cluster === state.cluster)) {
        clusterSelect.append(h("option", { value: state.cluster }, state.cluster));
      }
      clusterSelect.value = state.cluster;
      fillPools();
    }
    const span = SPANS[state.span];
    try {
      last = await get(withQuery("/api/v1/capacity", {
        cluster: state.cluster, pool: state.pool, resolution: span.resolution, points: span.points,
      }), { signal });
      error.hidden = true;
    } catch (err) {
      if (err.name !== "AbortError") {
        error.textContent = `Could not load capacity: ${err.status ? `${err.status} ` : ""}${err.message}`;
        error.hidden = false;
      }
      throw err;
    }
    const latest = last.history.length ? last.history[last.history.length - 1] : null;
    const pool = (clusters.find((c) => c.cluster === state.cluster) || { pools: [] }).pools.find((p) => p.pool === state.pool);
    summary.replaceChildren(...[
      h("h2", {}, `${last.cluster} / ${last.pool}`),
      h("span", {}, "latest ", h("b", {}, latest ? fmtPct(latest.util_pct, 1) : "—"),
        latest ? h("span", { class: "muted" }, ` at ${fmtTime(latest.at)}`) : null),
      pool ? h("span", {}, "queued demand ", h("b", {}, fmtPct(pool.demand_pct, 1))) : null,
      h("span", { class: "muted" }, `${last.history.length} points, ${last.resolution_s} s each; range ${last.band.low_enter}–${last.band.high_enter}%`),
    ].filter(Boolean));
    draw();
    report.replaceChildren(...reportPanel(last));
    await plan.refresh(state.cluster, state.pool, signal);
  }, POLL_MS, live);

  return () => { poll.stop(); window.removeEventListener("resize", onResize); };
}
