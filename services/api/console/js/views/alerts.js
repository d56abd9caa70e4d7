// Alerts: each alert's state (GET /api/v1/alerts every 5 s), firing first, filtered by status;
// a firing alert nobody has acknowledged yet offers "Acknowledge" (operator), which asks for a
// reason and POSTs /api/v1/alerts/<cluster>/<dedup key>/ack. Acknowledging says someone has seen
// it: it fires on until its cause ends, and Alertmanager and the webhooks are told.

import { get, post, withQuery } from "../api.js";
import { flash, reasonDialog, roleAllows, session } from "../actions.js";
import { alertCount } from "../alertcount.js";
import { replaceParams } from "../router.js";
import { badge, fmtAgo, fmtTime, h, pager } from "../dom.js";
import { listPoller } from "../poll.js";

const POLL_MS = 5000;
const REDRAW_MS = 10000;
const PAGE = 50;
const STATUSES = { "": "all", firing: "firing", resolved: "resolved" };

function acknowledge(alert, onDone) {
  const name = `${alert.cluster_id}/${alert.dedup_key}`;
  reasonDialog({
    action: "ack", title: "Acknowledge alert", confirm: "Acknowledge",
    subject: `${alert.kind} on ${alert.cluster_id} — ${alert.message}`,
    hint: "Says you have seen it (Alertmanager and the webhooks are told); it fires on until its cause ends.",
    send: (reason) => post(
      `/api/v1/alerts/${encodeURIComponent(alert.cluster_id)}/${encodeURIComponent(alert.dedup_key)}/ack`,
      { reason }),
    accepted: (acked) => {
      flash(`Alert ${name} acknowledged by ${acked.acknowledged_by}`, { testid: "alert-acknowledged" });
      alertCount.refresh();
      onDone();
    },
  });
}

function ackButton(alert, onDone) {
  if (alert.status !== "firing" || alert.acknowledged_by) return null;
  const allowed = roleAllows("operator");
  return h("button", {
    type: "button", class: "act small", "data-action": "ack", disabled: !allowed,
    title: allowed ? "Say you have seen it, and why" : `needs the operator role; you are ${session.role}`,
    onclick: () => acknowledge(alert, onDone),
  }, "Acknowledge");
}

function acknowledgedCell(alert) {
  if (!alert.acknowledged_by) return h("td", { class: "muted", "data-testid": "alert-ack" }, "—");
  return h("td", { "data-testid": "alert-ack", title: fmtTime(alert.acknowledged_at) },
    h("b", {}, alert.acknowledged_by), h("span", { class: "muted" }, ` ${fmtAgo(alert.acknowledged_at)}`),
    h("div", { class: "reason" }, alert.ack_reason || ""));
}

function resolutionCell(alert) {
  if (alert.status !== "resolved") return h("td", { class: "muted" }, "—");
  return h("td", { title: fmtTime(alert.resolved_at) },
    h("div", { class: "reason" }, alert.resolution || ""),
    h("span", { class: "muted" }, `resolved ${fmtAgo(alert.resolved_at)}`));
}

function alertRow(alert, onDone) {
  const unacked = alert.status === "firing" && !alert.acknowledged_by;
  return h("tr", {
    class: [alert.status, unacked && "unacked"],
    "data-alert": `${alert.cluster_id}/${alert.dedup_key}`, "data-status": alert.status,
    "data-acknowledged": alert.acknowledged_by ? "true" : "false",
  },
  h("td", { class: "nowrap" }, badge(alert.severity), " ", badge(alert.status)),
  h("td", {}, h("b", {}, alert.kind), h("div", { class: "mono muted nowrap" }, alert.dedup_key)),
  h("td", {}, alert.cluster_id),
  h("td", { class: "message", title: `subject ${alert.subject}, from ${alert.source}` }, alert.message),
  h("td", { class: "nowrap", title: fmtTime(alert.starts_at) }, fmtAgo(alert.starts_at)),
  h("td", { class: "num", title: "firing events since it started" }, alert.occurrences),
  acknowledgedCell(alert),
  resolutionCell(alert),
  h("td", { class: "actions" }, ackButton(alert, onDone)));
}

export function alertsView(container, { params, live }) {
  const filters = { status: params.get("status") || "", offset: Number(params.get("offset") || 0) };
  const statusSelect = h("select", { name: "status" },
    Object.entries(STATUSES).map(([v, label]) => h("option", { value: v }, label)));
  statusSelect.value = filters.status in STATUSES ? filters.status : "";
  const total = h("span", { class: "sub", "data-testid": "alert-total" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const tbody = h("tbody", {});
  const pages = pager(filters, PAGE, () => changed({ keepOffset: true }), ["‹ Previous", "Next ›"]);

  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Alerts"), total,
      h("span", { class: "sub" }, "firing first; what Alertmanager and the webhooks are told")),
    h("form", { class: "filters panel", onsubmit: (ev) => ev.preventDefault() },
      h("label", {}, "Status", statusSelect)),
    error,
    h("div", { class: "panel" },
      h("table", { class: "alerts", "data-testid": "alerts-table" },
        h("thead", {}, h("tr", {},
          ["Severity / status", "Alert", "Cluster", "Message", "Since", "Times", "Acknowledged", "Resolution", ""]
            .map((c) => h("th", {}, c)))),
        tbody),
      pages.el));

  function changed({ keepOffset = false } = {}) {
    filters.status = statusSelect.value;
    if (!keepOffset) filters.offset = 0;
    replaceParams("alerts", { status: filters.status, offset: filters.offset || "" });
    poll.refresh();
  }
  statusSelect.addEventListener("change", () => changed());

  function render(page) {
    total.textContent = `${page.total} alert${page.total === 1 ? "" : "s"}`;
    pages.show(page);
    if (!page.items.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 9, class: "empty" },
        filters.status ? `No ${filters.status} alert.` : "No alert has been raised.")));
      return;
    }
    tbody.replaceChildren(...page.items.map((alert) => alertRow(alert, () => poll.refresh())));
  }

  const poll = listPoller({
    url: () => withQuery("/api/v1/alerts", { status: filters.status, limit: PAGE, offset: filters.offset }),
    filters, render, error, what: "alerts", get, intervalMs: POLL_MS, redrawMs: REDRAW_MS, live,
  });
  return () => poll.stop();
}
