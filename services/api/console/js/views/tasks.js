// Tasks: a live list (GET /api/v1/tasks every 2 s) with filters, children indented under their
// parent, and the operator's actions.

import { get, withQuery } from "../api.js";
import { actionButtons } from "../actions.js";
import { replaceParams } from "../router.js";
import { badge, fmtAgo, fmtTime, h, pager, shortId } from "../dom.js";
import { listPoller } from "../poll.js";

const POLL_MS = 2000;
const REDRAW_MS = 10000;
const PAGE = 50;
const STATES = ["created", "queued", "dispatched", "running", "paused", "succeeded", "failed", "terminated"];
const KINDS = ["offline", "online", "scale_out", "scale_in", "load_balance", "migrate"];
const SINCE = { "": "any time", "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days" };
const SINCE_S = { "1h": 3600, "24h": 86400, "7d": 604800 };

/** Rows in display order: each task, then its children (oldest first) one level deeper. */
export function treeOrder(rows) {
  const byId = new Map(rows.map((r) => [r.task_id, r]));
  const children = new Map();
  const roots = [];
  for (const row of rows) {
    if (row.parent_task_id && byId.has(row.parent_task_id)) {
      if (!children.has(row.parent_task_id)) children.set(row.parent_task_id, []);
      children.get(row.parent_task_id).push(row);
    } else {
      roots.push(row);
    }
  }
  for (const list of children.values()) list.sort((a, b) => a.created_at.localeCompare(b.created_at));
  const out = [];
  const seen = new Set();
  const walk = (row, depth) => {
    if (seen.has(row.task_id)) return; // a cycle cannot happen, but never loop forever
    seen.add(row.task_id);
    out.push({ row, depth, orphan: depth === 0 && Boolean(row.parent_task_id) });
    for (const child of children.get(row.task_id) || []) walk(child, depth + 1);
  };
  for (const root of roots) walk(root, 0);
  return out;
}

function stepText(row) {
  if (row.step_count === null || row.step_count === undefined) return row.current_step === null ? "—" : `#${row.current_step}`;
  if (row.current_step === null || row.current_step === undefined) return `– / ${row.step_count}`;
  return `${row.current_step + 1} / ${row.step_count}`;
}

export function tasksView(container, { params, live }) {
  const filters = {
    node: params.get("node") || "",
    cluster: params.get("cluster") || "",
    state: params.get("state") || "",
    kind: params.get("kind") || "",
    since: params.get("since") || "",
    offset: Number(params.get("offset") || 0),
  };
  const clusterSelect = h("select", { name: "cluster" }, h("option", { value: "" }, "any"));
  if (filters.cluster) clusterSelect.append(h("option", { value: filters.cluster }, filters.cluster));
  clusterSelect.value = filters.cluster;
  const stateSelect = h("select", { name: "state" }, h("option", { value: "" }, "any"),
    STATES.map((st) => h("option", { value: st }, st)));
  stateSelect.value = filters.state;
  const sinceSelect = h("select", { name: "since" },
    Object.entries(SINCE).map(([v, label]) => h("option", { value: v }, label)));
  sinceSelect.value = filters.since;
  const nodeInput = h("input", { name: "node", type: "search", placeholder: "node id", value: filters.node });
  const kindInput = h("input", { name: "kind", type: "search", list: "kinds", placeholder: "need or task kind", value: filters.kind });
  const kinds = h("datalist", { id: "kinds" }, KINDS.map((k) => h("option", { value: k })));
  const total = h("span", { class: "sub", "data-testid": "task-total" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const tbody = h("tbody", {});
  const pages = pager(filters, PAGE, () => changed({ keepOffset: true }));

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Tasks"), total),
    h("form", { class: "filters panel", onsubmit: (ev) => ev.preventDefault() },
      h("label", {}, "Node", nodeInput),
      h("label", {}, "Cluster", clusterSelect),
      h("label", {}, "State", stateSelect),
      h("label", {}, "Kind", kindInput, kinds),
      h("label", {}, "Created", sinceSelect),
      h("span", { class: "grow" }),
      h("button", { type: "button", class: "secondary small", onclick: () => {
        nodeInput.value = ""; kindInput.value = ""; stateSelect.value = ""; clusterSelect.value = ""; sinceSelect.value = "";
        changed();
      } }, "Clear filters")),
    error,
    h("div", { class: "panel" },
      h("table", { class: "tasks", "data-testid": "tasks-table" },
        h("thead", {}, h("tr", {},
          ["State", "Task", "Target", "Cluster / pool", "Step", "Prio", "Created", "Updated", "Latest reason", "Actions"]
            .map((c) => h("th", {}, c)))),
        tbody),
      pages.el),
  );

  let debounce = null;
  function changed({ keepOffset = false } = {}) {
    filters.node = nodeInput.value.trim();
    filters.kind = kindInput.value.trim();
    filters.state = stateSelect.value;
    filters.cluster = clusterSelect.value;
    filters.since = sinceSelect.value;
    if (!keepOffset) filters.offset = 0;
    replaceParams("tasks", { ...filters, offset: filters.offset || "" });
    poll.refresh();
  }
  const typed = () => { clearTimeout(debounce); debounce = setTimeout(changed, 300); };
  nodeInput.addEventListener("input", typed);
  kindInput.addEventListener("input", typed);
  for (const el of [stateSelect, clusterSelect, sinceSelect]) el.addEventListener("change", () => changed());

  // The cluster choices, once: a failure only leaves the select with "any".
  get("/api/v1/clusters").then((data) => {
    for (const c of data.clusters || []) {
      if (c.cluster !== filters.cluster) clusterSelect.append(h("option", { value: c.cluster }, c.cluster));
    }
    clusterSelect.value = filters.cluster;
  }).catch(() => {});

  function render(page) {
    total.textContent = `${page.total} task${page.total === 1 ? "" : "s"}`;
    pages.show(page);
    if (!page.items.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 10, class: "empty" },
        filters.node || filters.state || filters.kind || filters.cluster || filters.since
          ? "No task matches these filters." : "No tasks recorded yet.")));
      return;
    }
    for (const row of page.items) {
      const k = row.kind || row.need_kind;
      if (k && !KINDS.includes(k)) { KINDS.push(k); kinds.append(h("option", { value: k })); }
    }
    tbody.replaceChildren(...treeOrder(page.items).map(({ row, depth, orphan }) => {
      const link = `#/task/${encodeURIComponent(row.task_id)}`;
      const title = [row.kind || row.need_kind || "task", row.template].filter(Boolean);
      return h("tr", {
        class: [depth > 0 && "child"], "data-task-id": row.task_id, "data-state": row.state,
      },
      h("td", {}, badge(row.state), row.dry_run ? [" ", badge("dry", "dry run")] : null),
      h("td", { class: "task-cell" },
        depth > 0 ? h("span", { class: "indent", style: { paddingLeft: `${(depth - 1) * 18}px` } }, "└─ ") : null,
        orphan ? h("span", { class: "indent", title: `child of ${row.parent_task_id}` }, "↳ ") : null,
        h("a", { href: link, "data-testid": "task-link" }, title[0]),
        title[1] ? h("span", { class: "muted" }, ` ${title[1]}`) : null,
        h("div", { class: "mono muted" }, shortId(row.task_id))),
      h("td", {}, row.target || "—"),
      h("td", {}, row.cluster_id, row.pool ? h("span", { class: "muted" }, ` / ${row.pool}`) : null),
      h("td", { class: "mono nowrap" }, stepText(row)),
      h("td", {}, row.priority ?? "—"),
      h("td", { title: fmtTime(row.created_at) }, fmtAgo(row.created_at)),
      h("td", { title: fmtTime(row.updated_at) }, fmtAgo(row.updated_at)),
      h("td", { class: "reason", title: row.reason }, row.reason.length > 140 ? `${row.reason.slice(0, 140)}…` : row.reason),
      h("td", { class: "actions" }, actionButtons(row, () => poll.refresh())));
    }));
  }

  const poll = listPoller({
    url: () => {
      const since = SINCE_S[filters.since] ? new Date(Date.now() - SINCE_S[filters.since] * 1000).toISOString() : "";
      return withQuery("/api/v1/tasks", {
        node: filters.node, cluster: filters.cluster, state: filters.state, kind: filters.kind,
        since, limit: PAGE, offset: filters.offset,
      });
    },
    filters, render, error, what: "tasks", get, intervalMs: POLL_MS, redrawMs: REDRAW_MS, live,
  });

  return () => { clearTimeout(debounce); poll.stop(); };
}
