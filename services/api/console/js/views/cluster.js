// Cluster: per cluster its node states, open needs and breakers (GET /api/v1/clusters), and per
// pool a heatmap of node utilisation (GET /api/v1/nodes): one tile per node, its colour the GPU
// utilisation, its border and pattern the node state. A tile opens the node's tasks.

import { get } from "../api.js";
import { badge, fmtAgo, fmtPct, fmtTime, h } from "../dom.js";
import { poller } from "../poll.js";

const POLL_MS = 5000;
// Utilisation colour stops (%): under the range blue, inside green, above amber to red.
const STOPS = [
  [0, [47, 109, 181]], [20, [90, 165, 214]], [50, [76, 175, 80]], [80, [224, 179, 58]], [100, [216, 67, 53]],
];
const NO_UTIL = new Set(["down", "offline", "enrolled"]);

export function utilColour(pct) {
  const v = Math.min(100, Math.max(0, Number(pct) || 0));
  for (let i = 1; i < STOPS.length; i += 1) {
    const [x1, c1] = STOPS[i];
    const [x0, c0] = STOPS[i - 1];
    if (v <= x1) {
      const t = (v - x0) / (x1 - x0);
      return c0.map((c, k) => Math.round(c + (c1[k] - c) * t));
    }
  }
  return STOPS[STOPS.length - 1][1];
}

function luminance([r, g, b]) {
  return (0.299 * r + 0.587 * g + 0.114 * b) / 255;
}

function tile(node) {
  const state = node.state || "enrolled";
  const hasUtil = !NO_UTIL.has(state) && node.util_pct !== null && node.util_pct !== undefined;
  const rgb = hasUtil ? utilColour(node.util_pct) : null;
  const jobs = node.jobs && node.jobs.length
    ? node.jobs.map((j) => `${j.job_id} (${j.kind}, ${j.state})`).join(", ") : "none";
  const title = [
    `${node.node_id} — ${state}${node.previous_state ? ` (was ${node.previous_state})` : ""}`,
    `utilisation ${fmtPct(node.util_pct, 1)}${node.gpus !== null && node.gpus !== undefined ? ` on ${node.gpus} GPU${node.gpus === 1 ? "" : "s"}` : ""}`,
    `mode ${node.mode || "—"}, faults ${node.fault_count}`,
    `jobs: ${jobs}`,
    `last report ${node.last_report_at ? `${fmtTime(node.last_report_at)} (${fmtAgo(node.last_report_at)})` : "never"}`,
    node.enrolled ? "enrolled" : "not enrolled",
    "click: the node's tasks",
  ].join("\n");
  return h("a", {
    class: ["tile", `st-${state}`, rgb && luminance(rgb) > 0.62 && "dark-ink"],
    href: `#/tasks?node=${encodeURIComponent(node.node_id)}`,
    title, "data-node": node.node_id, "data-state": state,
    style: rgb ? { backgroundColor: `rgb(${rgb.join(",")})` } : undefined,
  },
  h("div", { class: "name" }, node.node_id),
  h("div", { class: "util" }, hasUtil ? fmtPct(node.util_pct) : "—"),
  h("div", { class: "state" }, state, node.job_count ? ` · ${node.job_count} job${node.job_count === 1 ? "" : "s"}` : ""));
}

function legend() {
  return h("div", { class: "legend" },
    h("span", {}, "0%", h("span", { class: "ramp" }), "100% GPU utilisation (range 20–80%)"),
    ["suspect", "draining", "down", "offline"].map((st) => h("span", {}, h("span", { class: ["swatch", `st-${st}`] }), st)));
}

function stateChips(byState) {
  const entries = Object.entries(byState || {}).filter(([, n]) => n);
  if (!entries.length) return h("span", { class: "muted" }, "no nodes reported");
  return entries.map(([st, n]) => h("span", { class: "chip" }, badge(st, `${st} ${n}`)));
}

function poolSection(cluster, poolName, pool, nodes) {
  const stats = [];
  if (pool) {
    stats.push(h("span", { class: "stat" }, "utilisation ", h("b", {}, fmtPct(pool.util_pct, 1))));
    stats.push(h("span", { class: "stat" }, "queued demand ", h("b", {}, fmtPct(pool.demand_pct, 1))));
    if (pool.health) {
      stats.push(h("span", { class: "stat", title: `pool health at ${fmtTime(pool.health.at)}` },
        "unhealthy ", h("b", {}, fmtPct(pool.health.unhealthy_fraction * 100)), ` of ${pool.health.nodes_total}`));
    }
    const b = pool.budget;
    stats.push(h("span", { class: "stat", title: "offline budget: roundup(fraction × nodes) − offline − not ready" },
      "offline budget ", h("b", {}, b.remaining === null ? "unknown" : `${b.remaining} of ${b.capacity}`),
      ` (${Math.round(b.fraction * 100)}%)`));
  }
  return h("section", { class: "panel", "data-pool": poolName },
    h("div", { class: "pool-head" },
      h("h2", {}, `Pool ${poolName}`), h("span", { class: "muted" }, cluster),
      stats, h("span", {}, stateChips(pool ? pool.nodes_by_state : countStates(nodes)))),
    h("div", { class: "heatmap", "data-testid": "heatmap" }, nodes.map(tile)));
}

function countStates(nodes) {
  const out = {};
  for (const n of nodes) out[n.state] = (out[n.state] || 0) + 1;
  return out;
}

function breakersTable(breakers) {
  if (!breakers.length) return h("p", { class: "muted" }, "No breakers have tripped or been used yet.");
  return h("table", {},
    h("thead", {}, h("tr", {}, ["Breaker", "Scope", "Status", "Recent (S/F)", "Failures", "Opened"].map((c) => h("th", {}, c)))),
    h("tbody", {}, breakers.map((b) => h("tr", {},
      h("td", { class: "mono" }, b.name),
      h("td", {}, b.scope === "node" ? `node ${b.node}` : b.scope === "cluster" ? "whole cluster" : "kind"),
      h("td", {}, b.readable ? badge(b.status) : badge("failed", "unreadable")),
      h("td", { class: "mono" }, b.window || "—"),
      h("td", {}, `${b.consecutive_failures} in a row, opened ${b.openings}×`),
      h("td", {}, b.opened_at ? fmtTime(b.opened_at) : "—")))));
}

function render(container, clusters, nodes) {
  const sections = [];
  const names = new Set([...clusters.map((c) => c.cluster), ...nodes.map((n) => n.cluster)]);
  for (const name of [...names].sort()) {
    const c = clusters.find((x) => x.cluster === name);
    const mine = nodes.filter((n) => n.cluster === name);
    sections.push(h("section", { class: "panel", "data-cluster": name },
      h("div", { class: "page-head" }, h("h2", {}, `Cluster ${name}`),
        h("span", {}, `${mine.length} node${mine.length === 1 ? "" : "s"}`),
        h("span", {}, stateChips(c ? c.nodes_by_state : countStates(mine)))),
      h("div", { class: "cluster-summary" },
        h("div", {}, h("h3", {}, "Open needs"),
          c && c.open_needs.length
            ? h("ul", {}, c.open_needs.map((n) => h("li", {}, badge("queued", n.kind), ` ${n.target}`,
              n.expires_in_s !== null ? h("span", { class: "muted" }, ` (expires in ${n.expires_in_s} s)`) : null)))
            : h("p", { class: "muted" }, "none")),
        h("div", {}, h("h3", {}, "Circuit breakers"), breakersTable(c ? c.breakers : [])))));
    const pools = new Map();
    for (const n of mine) {
      const p = n.pool || "(not reported)";
      if (!pools.has(p)) pools.set(p, []);
      pools.get(p).push(n);
    }
    for (const p of c ? c.pools : []) if (!pools.has(p.pool)) pools.set(p.pool, []);
    for (const [poolName, poolNodes] of [...pools.entries()].sort(([a], [b]) => a.localeCompare(b))) {
      const pool = c ? c.pools.find((p) => p.pool === poolName) : null;
      poolNodes.sort((a, b) => a.node_id.localeCompare(b.node_id, undefined, { numeric: true }));
      sections.push(poolSection(name, poolName, pool, poolNodes));
    }
  }
  if (!sections.length) sections.push(h("p", { class: "panel muted" }, "No cluster has reported yet."));
  container.replaceChildren(...sections, legend());
}

export function clusterView(container, { live }) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  container.append(h("div", { class: "page-head" }, h("h1", {}, "Cluster"),
    h("span", { class: "sub" }, "node utilisation by pool; a tile opens the node's tasks")), body);
  const poll = poller(async (signal) => {
    const [clusters, nodes] = await Promise.all([
      get("/api/v1/clusters", { signal }), get("/api/v1/nodes", { signal }),
    ]);
    render(body, clusters.clusters || [], nodes.nodes || []);
  }, POLL_MS, live);
  return () => poll.stop();
}
