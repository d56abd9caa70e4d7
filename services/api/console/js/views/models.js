// Models: per task type, every model version the nodes serve (GET /api/v1/ml/models every 5 s,
// read live from the router's registry and statistics in Redis): its family, on how many
// nodes it is ready, and per node the arm's statistics — decayed outcomes (n_eff), the
// posterior mean success rate with its bounds, quarantine, tasks in flight and latency.

import { get, withQuery } from "../api.js";
import { replaceParams } from "../router.js";
import { badge, fmtAgo, fmtTime, h } from "../dom.js";
import { poller } from "../poll.js";
import { fmtMs, fmtNum, intervalBar } from "./mltasks.js";

const POLL_MS = 5000;

const num = fmtNum;

/** Arms grouped: task type -> "model:version" -> arms (sorted by node). */
export function groupArms(arms) {
  const types = new Map();
  for (const arm of arms) {
    if (!types.has(arm.task_type)) types.set(arm.task_type, new Map());
    const versions = types.get(arm.task_type);
    const key = `${arm.model}:${arm.version}`;
    if (!versions.has(key)) versions.set(key, []);
    versions.get(key).push(arm);
  }
  for (const versions of types.values()) {
    for (const list of versions.values()) list.sort((a, b) => a.node_id.localeCompare(b.node_id));
  }
  return types;
}


function quarantineCell(arm) {
  if (arm.quarantine === "closed") return badge("closed");
  const until = arm.quarantined_until ? ` until ${fmtTime(arm.quarantined_until)}` : "";
  return h("span", { title: `quarantined${until}` }, badge(arm.quarantine, arm.quarantine.replace("_", "-")),
    arm.quarantined_until ? h("div", { class: "muted" }, fmtTime(arm.quarantined_until)) : null);
}

function versionRows(key, arms) {
  const [model, version] = key.split(":");
  const ready = arms.filter((a) => a.ready).length;
  const families = [...new Set(arms.map((a) => a.family))].join(", ");
  const accuracies = arms.map((a) => a.accuracy).filter((a) => a !== null && a !== undefined);
  const accuracy = accuracies.length ? `held-out accuracy ${(Math.max(...accuracies) * 100).toFixed(1)}%` : "";
  const head = h("tr", { class: "version", "data-model": model, "data-version": version },
    h("td", { colspan: 12 },
      h("b", { class: "mono" }, model), h("span", { class: "mono" }, ` version ${version}`),
      h("span", { class: "chip" }, badge("family", families)),
      h("span", { class: ["ready-count", ready ? "ok" : "bad"], "data-testid": "nodes-ready" },
        `${ready} of ${arms.length} node${arms.length === 1 ? "" : "s"} ready`),
      accuracy ? h("span", { class: "muted" }, ` · ${accuracy}`) : null));
  const rows = arms.map((arm) => h("tr", {
    class: ["arm", !arm.ready && "not-ready"],
    "data-arm": `${arm.model}:${arm.version}@${arm.node_id}`, "data-ready": arm.ready ? "true" : "false",
  },
  h("td", { class: "mono indent-cell" }, arm.node_id),
  h("td", {}, badge(arm.model_state), arm.node_mode !== "active" ? [" ", badge(arm.node_mode)] : null),
  h("td", {}, arm.ready ? h("span", { class: "outcome ok" }, "✓ ready") : h("span", { class: "outcome bad", title: "not ready, not active, or its report is stale" }, "✗ not ready")),
  h("td", {}, quarantineCell(arm)),
  h("td", { class: "num", title: "decayed outcomes counted for or against the arm" }, num(arm.n_eff, 2)),
  h("td", { class: "num" }, num(arm.mean)),
  h("td", { class: "num nowrap" }, `${num(arm.lower)} – ${num(arm.upper)}`),
  h("td", { class: "bar-cell" }, intervalBar(arm)),
  h("td", { class: "num" }, arm.inflight),
  h("td", { class: "num nowrap" }, fmtMs(arm.latency_ms)),
  h("td", { class: "num" }, arm.accuracy === null || arm.accuracy === undefined ? "—" : `${(arm.accuracy * 100).toFixed(1)}%`),
  h("td", { title: fmtTime(arm.reported_at) }, fmtAgo(arm.reported_at))));
  return [head, ...rows];
}

function typeSection(taskType, versions) {
  const arms = [...versions.values()].flat();
  const ready = arms.filter((a) => a.ready).length;
  const nodes = new Set(arms.map((a) => a.node_id)).size;
  return h("section", { class: "panel", "data-task-type": taskType },
    h("div", { class: "page-head" }, h("h2", {}, `Task type ${taskType}`),
      h("span", { class: "sub" }, `${versions.size} model version${versions.size === 1 ? "" : "s"} on ${nodes} node${nodes === 1 ? "" : "s"}; ${ready} of ${arms.length} arms ready`)),
    h("table", { class: "models", "data-testid": "models-table" },
      h("thead", {}, h("tr", {},
        ["Node", "Model state", "Ready", "Quarantine", "n_eff", "Mean", "Lower – upper", "", "In flight", "Latency", "Accuracy", "Reported"]
          .map((c) => h("th", {}, c)))),
      h("tbody", {}, [...versions.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([key, list]) => versionRows(key, list)))));
}

export function modelsView(container, { params, live }) {
  const state = { cluster: params.get("cluster") || "" };
  const clusterSelect = h("select", { name: "cluster" }, h("option", { value: "" }, "the API's cluster"));
  if (state.cluster) clusterSelect.append(h("option", { value: state.cluster }, state.cluster));
  clusterSelect.value = state.cluster;
  const summary = h("span", { class: "sub", "data-testid": "models-summary" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Models"), summary),
    h("form", { class: "filters panel", onsubmit: (ev) => ev.preventDefault() },
      h("label", {}, "Cluster", clusterSelect),
      h("span", { class: "grow" }),
      h("span", { class: "muted legend-text" },
        "Mean: posterior success rate (with its parents' prior); lower – upper: its bounds; n_eff: decayed outcomes. Live from the router's statistics.")),
    error, body);

  clusterSelect.addEventListener("change", () => {
    state.cluster = clusterSelect.value;
    replaceParams("models", state);
    poll.refresh();
  });
  get("/api/v1/clusters").then((data) => {
    for (const c of data.clusters || []) {
      if (c.cluster !== state.cluster) clusterSelect.append(h("option", { value: c.cluster }, c.cluster));
    }
    clusterSelect.value = state.cluster;
  }).catch(() => {});

  let lastKey = "";
  const poll = poller(async (signal) => {
    let data;
    try {
      data = await get(withQuery("/api/v1/ml/models", { cluster: state.cluster }), { signal });
      error.hidden = true;
    } catch (err) {
      if (err.name !== "AbortError") {
        error.textContent = `Could not load the models: ${err.status ? `${err.status} ` : ""}${err.message}`;
        error.hidden = false;
      }
      throw err;
    }
    const key = JSON.stringify([state, data]);
    if (key === lastKey) return;
    lastKey = key;
    const types = groupArms(data.arms);
    const ready = data.arms.filter((a) => a.ready).length;
    summary.textContent = `cluster ${data.cluster_id}: ${types.size} task type${types.size === 1 ? "" : "s"}, ${data.arms.length} arm${data.arms.length === 1 ? "" : "s"} (${ready} ready)`;
    if (!data.arms.length) {
      body.replaceChildren(h("p", { class: "panel empty" },
        "No node reports serving a model in this cluster (agents serve the models in AGENT_MODELS)."));
      return;
    }
    body.replaceChildren(...[...types.entries()].sort(([a], [b]) => a.localeCompare(b))
      .map(([taskType, versions]) => typeSection(taskType, versions)));
  }, POLL_MS, live);

  return () => poll.stop();
}
