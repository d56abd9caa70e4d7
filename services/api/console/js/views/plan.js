// The capacity page's plan for procurement (GET /api/v1/capacity/plans): the pool's newest
// plan, made hourly by the analyzer from the daily and hourly history: the daily peak
// forecast with its 80 % and 95 % intervals against the range, when the range is left, and
// the nodes to order by when; downloadable as CSV and JSON.

import { download, errorLine, get, withQuery } from "../api.js";
import { drawCapacityChart } from "../chart.js";
import { fmtPct, fmtTime, h, kv } from "../dom.js";

const DAY_MS = 86400e3;
const day = (iso) => (iso ? iso.slice(0, 10) : "—");

function summary(p) {
  return kv([
    ["Model", p.model],
    ["History", `${p.history_days} days${p.history_from ? ` from ${day(p.history_from)}` : ""}; peak hour ${fmtPct(p.peak_uplift_pct, 1)} above the daily mean`],
    ["Pool now", `${p.nodes_now} nodes, ${p.gpus_now} GPUs; grows by ${p.node_type} (${p.gpus_per_node} GPUs)`],
    ["Leaves the range", p.leaves_range_at ? `${day(p.leaves_range_at)} (peak above ${p.band.high_enter}%)` : `not within ${p.horizon_days} days`],
    ["… on the 80% upper bound", p.leaves_range_at_upper_80 ? day(p.leaves_range_at_upper_80) : "—"],
    ["Below the range", p.below_range_at ? `${day(p.below_range_at)} (over capacity; nothing is removed)` : "—"],
    ["Generated", fmtTime(p.generated_at)],
  ]);
}

function orders(p) {
  if (!p.procurement.length) return h("p", {}, `No nodes to add within ${p.horizon_days} days.`);
  return h("table", { class: "table", "data-testid": "plan-procurement" },
    h("thead", {}, h("tr", {}, ["Needed by", "Order by", "Nodes", "GPUs", "Basis", "Why"].map((c) => h("th", {}, c)))),
    h("tbody", {}, p.procurement.map((s) => h("tr", {},
      h("td", {}, day(s.needed_by)), h("td", {}, `${day(s.order_by)}${s.late ? " (late)" : ""}`),
      h("td", {}, `${s.nodes} × ${s.node_type}`), h("td", {}, String(s.gpus)),
      h("td", {}, s.basis.replace("_", " ")), h("td", {}, s.reason)))));
}

/** The plan section: its element, and `refresh(cluster, pool, signal)` for the poller. */
export function planSection() {
  const chart = h("div", { class: "chart", "data-testid": "plan-chart" });
  const body = h("div", {});
  const status = h("p", { class: "muted" });
  let current = { cluster: "", pool: "", plan: null };

  function save(kind) {
    const query = { cluster: current.cluster, pool: current.pool };
    const name = `capacity-plan-${current.cluster}-${current.pool}`;
    const path = kind === "csv" ? withQuery("/api/v1/capacity/plans.csv", query)
      : withQuery("/api/v1/capacity/plans", { ...query, limit: 1 });
    download(path, `${name}.${kind}`).catch((err) => { status.textContent = `Download failed: ${errorLine(err)}`; });
  }

  function draw() {
    const p = current.plan;
    if (!p || !p.days.length) { chart.replaceChildren(); return; }
    drawCapacityChart(chart, {
      history: [], resolution_s: 86400, band: p.band, now: new Date(p.generated_at),
      horizonMs: p.horizon_days * DAY_MS, forecastGapMs: 2 * DAY_MS,
      forecast: { points: p.days.map((d) => ({ at: d.day, mean: d.peak_pct, lower_80: d.lower_80,
        upper_80: d.upper_80, lower_95: d.lower_95, upper_95: d.upper_95 })) },
      markers: p.procurement.map((s) => ({ at: s.needed_by, label: `+${s.nodes} ${s.node_type} by` })),
    });
  }

  const element = h("section", { class: "panel", "data-testid": "capacity-plan" },
    h("div", { class: "page-head" }, h("h2", {}, "Capacity plan (procurement)"),
      h("button", { type: "button", onclick: () => save("csv") }, "Download CSV"),
      h("button", { type: "button", onclick: () => save("json") }, "Download JSON")),
    status, chart,
    h("div", { class: "chart-legend" },
      h("span", {}, h("i", { class: "fc-mean" }), "daily peak forecast"),
      h("span", {}, h("i", { class: "fc-80" }), "80% interval"),
      h("span", {}, h("i", { class: "fc-95" }), "95% interval"),
      h("span", {}, h("i", { class: "band" }), "range")),
    body);

  async function refresh(cluster, pool, signal) {
    current = { cluster, pool, plan: null };
    try {
      const page = await get(withQuery("/api/v1/capacity/plans", { cluster, pool, limit: 1 }), { signal });
      current.plan = page.items.length ? page.items[0].plan : null;
      status.textContent = current.plan ? "" : "No plan recorded for this pool yet (the analyzer plans every pool hourly).";
    } catch (err) {
      if (err.name === "AbortError") throw err;
      status.textContent = `Could not load the plan: ${errorLine(err)}`;
    }
    const p = current.plan;
    body.replaceChildren(...(p ? [summary(p), h("h3", {}, "Nodes to order"), orders(p),
      ...(p.notes.length ? [h("ul", { class: "muted" }, p.notes.map((n) => h("li", {}, n)))] : [])] : []));
    draw();
  }

  return { element, refresh, draw };
}
