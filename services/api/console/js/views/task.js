// One task (GET /api/v1/tasks/{id}, every 2 s): its steps as a timeline with commands and results
// (initial -> target resources), every transition with actor and reason, the evidence of its
// need, its children, and the actions (Restart among them, for a failed or terminated task;
// a restarted task says by whom, and its steps show the latest run).

import { ApiError, get } from "../api.js";
import { actionButtons } from "../actions.js";
import { badge, fmtAgo, fmtDuration, fmtTime, fmtValue, h, kv, shortId, since } from "../dom.js";
import { poller } from "../poll.js";

const POLL_MS = 2000;
const REDRAW_MS = 10000;
const FINAL = new Set(["succeeded", "failed", "terminated"]);

/** The pause the executor acknowledged that waits for the running step to end (or null): as
 * the API decides (services/api/v1/control.py pause_requested), so the page and a 409 agree. */
export function pendingPause(task) {
  if (task.state !== "running") return null;
  let pending = null;
  for (const t of task.transitions) {
    const outputs = t.outputs || {};
    const control = outputs.refused ? null : outputs.control;
    if (control === "pause" && t.state === "running") pending = t;
    else if (control === "resume" || t.state !== "running") pending = null;
  }
  return pending;
}

/** The latest restart a task had (a transition), or null: its steps are that run's. */
export function lastRestart(task) {
  let found = null;
  for (const t of task.transitions) {
    const outputs = t.outputs || {};
    if (outputs.control === "restart" && !outputs.refused) found = t;
  }
  return found;
}

/** Step outputs split into initial -> target pairs (initial_nodes / target_nodes...) and the rest. */
export function splitOutputs(outputs) {
  const pairs = [];
  const rest = [];
  const used = new Set();
  for (const key of Object.keys(outputs || {})) {
    if (key.startsWith("initial_") && `target_${key.slice(8)}` in outputs) {
      pairs.push([key.slice(8), outputs[key], outputs[`target_${key.slice(8)}`]]);
      used.add(key);
      used.add(`target_${key.slice(8)}`);
    }
  }
  for (const [key, value] of Object.entries(outputs || {})) if (!used.has(key)) rest.push([key, value]);
  return { pairs, rest };
}

function resourceValue(name, value) {
  return name.endsWith("_pct") ? `${Number(value).toFixed(1)}%` : fmtValue(value);
}

function resources(pairs) {
  if (!pairs.length) return null;
  return h("div", { class: "resources", "data-testid": "resources" },
    pairs.map(([name, from, to]) => [
      h("span", { class: "muted" }, name.replace(/_pct$/, " util").replace(/_/g, " ")),
      h("span", {}, resourceValue(name, from)),
      h("span", { class: "arrow" }, "→"),
      h("span", { class: "to" }, resourceValue(name, to)),
    ]));
}

function gantt(task) {
  const started = task.steps.filter((st) => st.started_at);
  if (!started.length) return null;
  const t0 = Math.min(...started.map((st) => new Date(st.started_at).getTime()));
  const ends = started.map((st) => (st.ended_at ? new Date(st.ended_at).getTime() : Date.now()));
  const t1 = Math.max(...ends, task.finished_at ? new Date(task.finished_at).getTime() : 0, t0 + 1000);
  const span = t1 - t0;
  return h("div", { class: "gantt", "aria-label": "step timeline" },
    task.steps.map((st) => {
      const track = h("div", { class: "gantt-track" });
      if (st.started_at) {
        const a = new Date(st.started_at).getTime();
        const b = st.ended_at ? new Date(st.ended_at).getTime() : Date.now();
        track.append(h("div", {
          class: ["gantt-bar", st.state],
          style: { left: `${((a - t0) / span) * 100}%`, width: `${Math.max(0.4, ((b - a) / span) * 100)}%` },
          title: `#${st.index} ${st.name || st.action}: ${st.state}, ${fmtDuration((b - a) / 1000)}`,
        }));
      }
      return h("div", { class: "gantt-row" },
        h("span", { class: "label" }, `#${st.index} ${st.name || st.action || ""}`), track);
    }),
    h("div", { class: "gantt-axis" }, h("div", {}),
      h("div", {}, h("span", {}, fmtTime(new Date(t0).toISOString())),
        h("span", {}, fmtDuration(span / 1000)),
        h("span", {}, task.finished_at ? fmtTime(task.finished_at) : "now"))));
}

// An execution count: how many ops (nodes added or removed, jobs moved, nodes taken offline);
// null means the count is computed when the step or task runs.
function opsText(count) {
  return count === null || count === undefined ? "computed at run time" : `${count} op${count === 1 ? "" : "s"}`;
}

function relationsText(rel) {
  if (!rel) return "—";
  const parts = [`concurrency ${rel.concurrency}`];
  if (rel.exclusive_with?.length) parts.push(`exclusive with ${rel.exclusive_with.map((r) => `${r.template} (${r.scope})`).join(", ")}`);
  if (rel.depends_on?.length) parts.push(`depends on ${rel.depends_on.map((r) => `${r.template} (${r.scope}, on failure ${r.on_failure})`).join(", ")}`);
  if (rel.concurrent_with?.length) parts.push(`concurrent with ${rel.concurrent_with.join(", ")}`);
  return parts.join("; ");
}

function stepCard(task, st) {
  const { pairs, rest } = splitOutputs(st.outputs);
  const counts = task.step_execution_counts || [];
  const current = !FINAL.has(task.state) && task.current_step === st.index;
  const args = st.action_args && Object.keys(st.action_args).length
    ? Object.entries(st.action_args).map(([k, v]) => `${k}=${fmtValue(v)}`).join(" ") : null;
  return h("li", { class: [st.state, current && "current"], "data-step": st.index, "data-state": st.state },
    h("div", { class: "step-title" },
      h("span", {}, `#${st.index}`), h("span", {}, st.name || st.action || "step"),
      st.action ? h("span", { class: "action" }, st.action) : null,
      badge(st.state),
      st.guard ? h("span", { class: "muted", title: "checked on fresh state just before the step" }, `guard: ${st.guard}`) : null),
    h("div", { class: "step-meta" },
      st.node_id ? h("span", {}, `node ${st.node_id}`) : null,
      h("span", {}, st.started_at ? `started ${fmtTime(st.started_at)}` : "not started"),
      st.ended_at ? h("span", {}, `ended ${fmtTime(st.ended_at)}`) : null,
      st.started_at ? h("span", {}, fmtDuration(since(st.started_at, st.ended_at))) : null,
      h("span", {}, `attempt${st.attempts === 1 ? "" : "s"} ${st.attempts}${st.max_attempts ? ` of ${st.max_attempts}` : ""}`),
      st.timeout_s ? h("span", {}, `timeout ${fmtDuration(st.timeout_s)}`) : null,
      st.index < counts.length ? h("span", { "data-testid": "step-ops" }, `executes ${opsText(counts[st.index])}`) : null),
    st.command_id ? h("div", { class: "step-meta" }, "command ", h("code", { title: st.command_id }, st.command_id)) : null,
    args ? h("div", { class: "step-meta" }, "args ", h("code", {}, args)) : null,
    resources(pairs),
    rest.length ? kv(rest, "kv compact outputs") : null,
    st.reason ? h("div", { class: "step-meta" }, st.reason) : null);
}

function transitionsTable(task) {
  return h("table", { class: "transitions" },
    h("thead", {}, h("tr", {}, ["Time", "State", "Step", "Actor", "Reason", "Command", "Outputs"].map((c) => h("th", {}, c)))),
    h("tbody", {}, task.transitions.map((t) => {
      const control = t.outputs && t.outputs.control;
      const refused = t.outputs && t.outputs.refused;
      const outputs = Object.entries(t.outputs || {}).map(([k, v]) => `${k}=${fmtValue(v)}`).join(" ");
      return h("tr", { class: [control && "control", refused && "refused"] },
        h("td", { class: "mono" }, fmtTime(t.occurred_at)),
        h("td", {}, t.previous_state && t.previous_state !== t.state ? [h("span", { class: "muted" }, `${t.previous_state} → `), badge(t.state)] : badge(t.state)),
        h("td", {}, t.step_index === null ? "—" : [`#${t.step_index} `, t.step_state ? badge(t.step_state) : null]),
        h("td", {}, t.actor),
        h("td", { class: "reason" }, t.reason),
        h("td", { class: "mono" }, t.command_id ? h("span", { title: t.command_id }, shortId(t.command_id)) : "—"),
        h("td", { class: "mono outputs" }, outputs || "—"));
    })));
}

function evidenceBlock(task) {
  if (!task.evidence || !task.evidence.length) return h("p", { class: "muted" }, "No evidence recorded (a child task carries its parent's).");
  return task.evidence.map((item, i) => h("div", { class: "evidence" },
    task.evidence.length > 1 ? h("h3", {}, `Evidence ${i + 1}`) : null,
    kv(Object.entries(item).map(([k, v]) => [k, typeof v === "object" && v !== null
      ? h("code", {}, JSON.stringify(v)) : v]), "kv compact")));
}

function childrenTable(task) {
  if (!task.children.length) return h("p", { class: "muted" }, "No child tasks.");
  return h("table", {},
    h("thead", {}, h("tr", {}, ["State", "Task", "Target", "Step", "Created", "Latest reason"].map((c) => h("th", {}, c)))),
    h("tbody", {}, task.children.map((c) => h("tr", { "data-task-id": c.task_id },
      h("td", {}, badge(c.state)),
      h("td", {}, h("a", { href: `#/task/${encodeURIComponent(c.task_id)}` }, c.kind || c.need_kind || "task"),
        h("div", { class: "mono muted" }, shortId(c.task_id))),
      h("td", {}, c.target || "—"),
      h("td", { class: "mono" }, c.current_step === null ? "—" : `${c.current_step + 1} / ${c.step_count ?? "?"}`),
      h("td", { title: fmtTime(c.created_at) }, fmtAgo(c.created_at)),
      h("td", { class: "reason" }, c.reason)))));
}

function render(container, task, refresh) {
  const pending = pendingPause(task);
  const restarted = lastRestart(task);
  const title = [task.kind || task.need_kind || "task", task.target].filter(Boolean).join(" · ");
  container.replaceChildren(
    h("div", { class: "panel" },
      h("div", { class: "detail-head" },
        h("div", {},
          h("h1", {}, title, h("span", { "data-testid": "task-state" }, badge(task.state)),
            task.dry_run ? badge("dry", "dry run") : null),
          h("div", { class: "mono muted" }, task.task_id),
          task.parent_task_id ? h("div", {}, "child of ", h("a", { href: `#/task/${encodeURIComponent(task.parent_task_id)}` }, shortId(task.parent_task_id))) : null),
        h("div", { class: "actions", "data-testid": "task-actions" }, actionButtons(task, refresh, { small: false }))),
      pending ? h("p", { class: "pending-control", "data-testid": "pending-control" },
        `Pause requested by ${pending.actor} ${fmtAgo(pending.occurred_at)}: the task pauses when the running step ends.`) : null,
      restarted ? h("p", { class: "pending-control", "data-testid": "task-restarted" },
        `Restarted by ${restarted.actor} ${fmtAgo(restarted.occurred_at)} (run ${restarted.outputs.run ?? "?"}): ${restarted.reason}`) : null,
      h("p", { "data-testid": "task-reason" }, task.reason),
      kv([
        ["Cluster / pool", `${task.cluster_id}${task.pool ? ` / ${task.pool}` : ""}`],
        ["Template", task.template ?? "—"],
        ["Need", task.need_kind ? `${task.need_kind}${task.need_id ? ` (${shortId(task.need_id)})` : ""}` : "—"],
        ["Priority", task.priority ?? "—"],
        ["Executes", task.plan ? opsText(task.execution_count) : "—"],
        ["Relations", relationsText(task.relations)],
        ["Step", task.current_step === null ? "—" : `${task.current_step + 1} of ${task.step_count ?? task.steps.length}`],
        ["Created", fmtTime(task.created_at)],
        ["Updated", `${fmtTime(task.updated_at)} (${fmtAgo(task.updated_at)})`],
        ["Finished", task.finished_at ? `${fmtTime(task.finished_at)} after ${fmtDuration(since(task.created_at, task.finished_at))}` : "—"],
      ])),
    h("div", { class: "grid2" },
      h("div", {},
        h("section", { class: "panel" }, h("h2", {}, `Steps (${task.steps.length})`), gantt(task),
          task.steps.length ? h("ol", { class: "timeline", "data-testid": "steps" }, task.steps.map((st) => stepCard(task, st)))
            : h("p", { class: "muted" }, "No steps known yet.")),
      ),
      h("div", {},
        h("section", { class: "panel" }, h("h2", {}, "Evidence"), evidenceBlock(task)),
        h("section", { class: "panel" }, h("h2", {}, `Children (${task.children.length})`), childrenTable(task)),
        task.plan ? h("section", { class: "panel" }, h("details", {},
          h("summary", {}, "Plan (the task as created)"),
          h("pre", { class: "json" }, JSON.stringify(task.plan, null, 2)))) : null)),
    h("section", { class: "panel" }, h("h2", {}, `Transitions (${task.transitions.length})`), transitionsTable(task)));
}

export function taskView(container, { arg, live }) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  container.append(
    h("div", { class: "page-head" }, h("a", { href: "#/tasks" }, "‹ Tasks")),
    body);
  let openPlan = false;
  let lastKey = "";
  let lastDrawn = 0;
  const poll = poller(async (signal) => {
    try {
      const task = await get(`/api/v1/tasks/${encodeURIComponent(arg)}`, { signal });
      // As on the list: unchanged data is redrawn only now and then (the "… ago" times).
      const key = JSON.stringify(task);
      if (key === lastKey && Date.now() - lastDrawn < REDRAW_MS) return;
      lastKey = key;
      lastDrawn = Date.now();
      // Keep the plan's <details> open across refreshes, and the scroll position.
      const details = body.querySelector("details");
      if (details) openPlan = details.open;
      render(body, task, () => poll.refresh());
      const again = body.querySelector("details");
      if (again) again.open = openPlan;
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 422)) {
        body.replaceChildren(h("p", { class: "error" }, err.status === 404 ? err.message : `No task ${arg}: ${err.message}`));
        return;
      }
      throw err;
    }
  }, POLL_MS, live);
  return () => poll.stop();
}
