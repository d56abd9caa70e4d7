// ML tasks: a live list (GET /api/v1/ml/tasks every 2 s) with filters, and for an operator a form
// that submits one (POST /api/v1/ml/tasks). The router chooses the model; the store records the
// submission, each decision and each attempt's outcome, which is what this page shows.

import { errorLine, get, post, withQuery } from "../api.js";
import { flash, session } from "../actions.js";
import { replaceParams } from "../router.js";
import { badge, fmtAgo, fmtTime, h, pager, shortId } from "../dom.js";
import { listPoller } from "../poll.js";

const POLL_MS = 2000;
const REDRAW_MS = 10000;
const PAGE = 50;
export const ML_STATES = ["submitted", "running", "succeeded", "failed"];
const SINCE = { "": "any time", "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days" };
const SINCE_S = { "1h": 3600, "24h": 86400, "7d": 604800 };
// Task types the filter and the form offer before the models are read.
const TYPES = ["digits"];

/** "digits-mlp:1@node-002" (or "—" before any choice). */
export function armText(model, version, node) {
  if (!model) return "—";
  return `${model}${version ? `:${version}` : ""}${node ? `@${node}` : ""}`;
}

/** The latest attempt's answer: the prediction and its confidence, or the failure's cause. */
export function outcomeCell(row) {
  if (row.prediction !== null && row.prediction !== undefined) {
    const conf = row.confidence === null || row.confidence === undefined ? ""
      : ` (${(row.confidence * 100).toFixed(1)}%)`;
    return h("span", { class: "outcome ok" }, `→ ${row.prediction}${conf}`);
  }
  if (row.cause) return h("span", { class: "outcome bad" }, row.cause.replace(/_/g, " "));
  if (row.state === "succeeded") return h("span", { class: "outcome ok" }, "succeeded");
  return h("span", { class: "muted" }, row.state === "failed" ? "failed" : "—");
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Number(ms).toFixed(ms < 10 ? 2 : 0)} ms`;
}

/** A posterior interval [lower, upper] with its mean, drawn on a 0..1 scale. */
export function intervalBar(stats) {
  const clamp = (v) => Math.min(1, Math.max(0, Number(v) || 0));
  return h("div", { class: "interval", title: `mean ${fmtNum(stats.mean)} in [${fmtNum(stats.lower)}, ${fmtNum(stats.upper)}]` },
    h("span", { class: "range", style: { left: `${clamp(stats.lower) * 100}%`, width: `${Math.max(0.5, (clamp(stats.upper) - clamp(stats.lower)) * 100)}%` } }),
    h("span", { class: "mean", style: { left: `${clamp(stats.mean) * 100}%` } }));
}

export const fmtNum = (v, digits = 3) => (v === null || v === undefined ? "—" : Number(v).toFixed(digits));

/** "12, 0 4 16" -> [12, 0, 4, 16]; null when something is not a number. */
export function parseNumbers(text) {
  const parts = String(text).split(/[\s,;]+/).filter(Boolean);
  const values = parts.map(Number);
  return parts.length && values.every((v) => Number.isFinite(v)) ? values : null;
}

function submitPanel(types, onAccepted) {
  const typeInput = h("input", { name: "task_type", list: "ml-types-submit", value: "digits", required: true });
  const typeList = h("datalist", { id: "ml-types-submit" }, types.map((t) => h("option", { value: t })));
  const input = h("textarea", { name: "input", rows: 3, required: true, "data-testid": "ml-input",
    placeholder: "the input numbers, separated by commas or spaces (digits: 64 pixel counts 0..16, row by row)" });
  const deadline = h("input", { name: "deadline_s", type: "number", min: 0.1, max: 3600, step: "any", value: 10 });
  const priority = h("input", { name: "priority", type: "number", min: 0, max: 9, step: 1, value: 5 });
  const critical = h("input", { name: "critical", type: "checkbox" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const button = h("button", { type: "submit", "data-testid": "ml-submit" }, "Submit");
  const form = h("form", {
    class: "ml-submit",
    onsubmit: async (ev) => {
      ev.preventDefault();
      const values = parseNumbers(input.value);
      if (!values) {
        error.textContent = "The input must be numbers separated by commas or spaces.";
        error.hidden = false;
        return;
      }
      button.disabled = true;
      error.hidden = true;
      try {
        const accepted = await post("/api/v1/ml/tasks", {
          task_type: typeInput.value.trim(), input: values, deadline_s: Number(deadline.value),
          priority: Number(priority.value), critical: critical.checked,
        });
        flash(`ML task ${shortId(accepted.task_id)} submitted; the router chooses its model.`,
          { testid: "ml-accepted" });
        input.value = "";
        onAccepted(accepted);
      } catch (err) {
        error.textContent = errorLine(err);
        error.hidden = false;
      } finally {
        button.disabled = false;
      }
    },
  },
  h("div", { class: "filters" },
    h("label", {}, "Task type", typeInput, typeList),
    h("label", {}, "Deadline (s)", deadline),
    h("label", {}, "Priority (0 most urgent)", priority),
    h("label", { class: "check" }, critical, " critical (choose by a pessimistic bound)")),
  h("label", {}, "Input", input),
  error,
  h("div", { class: "buttons" }, button));
  return h("details", { class: "panel", "data-testid": "ml-submit-panel" },
    h("summary", {}, "Submit an ML task"), form);
}

export function mlTasksView(container, { params, live }) {
  const filters = {
    state: params.get("state") || "",
    task_type: params.get("task_type") || "",
    node: params.get("node") || "",
    model: params.get("model") || "",
    since: params.get("since") || "",
    offset: Number(params.get("offset") || 0),
  };
  const types = [...TYPES];
  const stateSelect = h("select", { name: "state" }, h("option", { value: "" }, "any"),
    ML_STATES.map((st) => h("option", { value: st }, st)));
  stateSelect.value = filters.state;
  const typeInput = h("input", { name: "task_type", type: "search", list: "ml-types", placeholder: "task type", value: filters.task_type });
  const typeList = h("datalist", { id: "ml-types" }, types.map((t) => h("option", { value: t })));
  const nodeInput = h("input", { name: "node", type: "search", placeholder: "any attempt ran there", value: filters.node });
  const modelInput = h("input", { name: "model", type: "search", placeholder: "model name", value: filters.model });
  const sinceSelect = h("select", { name: "since" },
    Object.entries(SINCE).map(([v, label]) => h("option", { value: v }, label)));
  sinceSelect.value = filters.since;
  const total = h("span", { class: "sub", "data-testid": "ml-total" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const tbody = h("tbody", {});
  const pages = pager(filters, PAGE, () => changed({ keepOffset: true }));
  // Offered to operators (and where the API does not say the role: it answers 403 if need be).
  const canSubmit = session.role !== "viewer";

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "ML tasks"), total,
      h("span", { class: "sub" }, "the router chooses a model version and a node for each; ",
        h("a", { href: "#/models" }, "see the models"))),
    canSubmit ? submitPanel(types, (accepted) => { location.hash = `#/mltask/${encodeURIComponent(accepted.task_id)}`; }) : null,
    h("form", { class: "filters panel", onsubmit: (ev) => ev.preventDefault() },
      h("label", {}, "State", stateSelect),
      h("label", {}, "Task type", typeInput, typeList),
      h("label", {}, "Node", nodeInput),
      h("label", {}, "Model", modelInput),
      h("label", {}, "Active", sinceSelect),
      h("span", { class: "grow" }),
      h("button", { type: "button", class: "secondary small", onclick: () => {
        stateSelect.value = ""; typeInput.value = ""; nodeInput.value = ""; modelInput.value = ""; sinceSelect.value = "";
        changed();
      } }, "Clear filters")),
    error,
    h("div", { class: "panel" },
      h("table", { class: "ml-tasks", "data-testid": "ml-tasks-table" },
        h("thead", {}, h("tr", {},
          ["State", "Task", "Model @ node", "Attempts", "Outcome", "Latency", "Prio", "Age", "Updated", "Latest reason"]
            .map((c) => h("th", {}, c)))),
        tbody),
      pages.el),
  );

  function addTypes(list) {
    for (const t of list) {
      if (t && !types.includes(t)) {
        types.push(t);
        for (const dl of container.querySelectorAll("datalist")) dl.append(h("option", { value: t }));
      }
    }
  }
  // The task types served now, once (a failure leaves the defaults).
  get("/api/v1/ml/models").then((data) => addTypes((data.arms || []).map((a) => a.task_type))).catch(() => {});

  let debounce = null;
  function changed({ keepOffset = false } = {}) {
    filters.state = stateSelect.value;
    filters.task_type = typeInput.value.trim();
    filters.node = nodeInput.value.trim();
    filters.model = modelInput.value.trim();
    filters.since = sinceSelect.value;
    if (!keepOffset) filters.offset = 0;
    replaceParams("ml", { ...filters, offset: filters.offset || "" });
    poll.refresh();
  }
  const typed = () => { clearTimeout(debounce); debounce = setTimeout(changed, 300); };
  for (const el of [typeInput, nodeInput, modelInput]) el.addEventListener("input", typed);
  for (const el of [stateSelect, sinceSelect]) el.addEventListener("change", () => changed());

  function render(page) {
    total.textContent = `${page.total} task${page.total === 1 ? "" : "s"}`;
    pages.show(page);
    addTypes(page.items.map((r) => r.task_type));
    if (!page.items.length) {
      const filtered = filters.state || filters.task_type || filters.node || filters.model || filters.since;
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 10, class: "empty" },
        filtered ? "No ML task matches these filters." : "No ML tasks recorded yet.")));
      return;
    }
    tbody.replaceChildren(...page.items.map((row) => h("tr", {
      "data-task-id": row.task_id, "data-state": row.state,
    },
    h("td", {}, badge(row.state), row.critical ? [" ", badge("critical")] : null),
    h("td", { class: "task-cell" },
      h("a", { href: `#/mltask/${encodeURIComponent(row.task_id)}`, "data-testid": "ml-task-link" }, row.task_type || "task"),
      h("div", { class: "mono muted" }, shortId(row.task_id))),
    h("td", { class: "mono", "data-testid": "ml-arm" }, armText(row.model, row.version, row.node_id),
      row.family ? h("div", { class: "muted" }, row.family) : null),
    h("td", { class: "num" }, row.attempts),
    h("td", { "data-testid": "ml-outcome" }, outcomeCell(row)),
    h("td", { class: "nowrap" }, fmtMs(row.latency_ms)),
    h("td", {}, row.priority ?? "—"),
    h("td", { title: fmtTime(row.created_at) }, fmtAgo(row.created_at)),
    h("td", { title: fmtTime(row.updated_at) }, fmtAgo(row.updated_at)),
    h("td", { class: "reason", title: row.reason }, row.reason.length > 140 ? `${row.reason.slice(0, 140)}…` : row.reason))));
  }

  const poll = listPoller({
    url: () => {
      const since = SINCE_S[filters.since] ? new Date(Date.now() - SINCE_S[filters.since] * 1000).toISOString() : "";
      return withQuery("/api/v1/ml/tasks", {
        state: filters.state, task_type: filters.task_type, node: filters.node, model: filters.model,
        since, limit: PAGE, offset: filters.offset,
      });
    },
    filters, render, error, what: "ML tasks", get, intervalMs: POLL_MS, redrawMs: REDRAW_MS, live,
  });

  return () => { clearTimeout(debounce); poll.stop(); };
}
