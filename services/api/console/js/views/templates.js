// Templates: every template's active version, origin and pin (GET /api/v1/templates), and one
// template's page (#/template/<name>): its active YAML, its history (origin, who, why, a tuned
// version's evidence), a diff between any two versions, "Roll back to vN" (admin: a new
// version equal to vN, used by the running templaters at once) and Pin / Unpin (operator: a
// pinned template is never tuned). Each change asks for a reason, kept in the audit log.

import { get, post, withQuery } from "../api.js";
import { flash, reasonDialog, roleAllows, session } from "../actions.js";
import { badge, fmtAgo, fmtTime, h } from "../dom.js";
import { poller } from "../poll.js";

const POLL_MS = 10000;

function guarded(role, attrs, text) {
  const allowed = roleAllows(role);
  return h("button", {
    ...attrs, type: "button", class: "act small", disabled: !allowed,
    title: allowed ? attrs.title : `needs the ${role} role; you are ${session.role}`,
  }, text);
}

export function templatesView(container, { live }) {
  const tbody = h("tbody", {});
  const error = h("p", { class: "error", role: "alert", hidden: true });
  container.append(
    h("div", { class: "page-head" }, h("h1", {}, "Templates"),
      h("span", { class: "sub" }, "the active version of each; edits, rollbacks and tuning make new versions")),
    error,
    h("div", { class: "panel" }, h("table", { "data-testid": "templates-table" },
      h("thead", {}, h("tr", {}, ["Template", "Version", "Origin", "Need", "Pinned", "Changed", "Description"]
        .map((c) => h("th", {}, c)))), tbody)));
  const poll = poller(async (signal) => {
    try {
      const found = await get("/api/v1/templates", { signal });
      error.hidden = true;
      tbody.replaceChildren(...found.map((t) => h("tr", { "data-template": t.name },
        h("td", {}, h("a", { href: `#/template/${encodeURIComponent(t.name)}` }, h("b", {}, t.name))),
        h("td", { class: "num" }, `v${t.version}`),
        h("td", {}, badge(t.origin || "—")),
        h("td", {}, t.need || "—"),
        h("td", { title: t.pin_reason || "" }, t.pinned ? `yes (${t.pinned_by})` : t.tunable ? "no (tuned)" : "no"),
        h("td", { class: "nowrap", title: fmtTime(t.updated_at) }, fmtAgo(t.updated_at)),
        h("td", {}, t.error ? `BROKEN: ${t.error}` : t.description))));
    } catch (err) {
      error.textContent = `Could not load the templates: ${err.message}`;
      error.hidden = false;
      throw err;
    }
  }, POLL_MS, live);
  return () => poll.stop();
}

function evidenceLine(v) {
  const e = v.evidence || {};
  if (v.origin === "tuned") {
    const per = (e.measures || []).map((m) =>
      `${m.node_type} in ${m.cluster}/${m.pool}: ${m.throughput_per_node}/node, ${m.throughput_per_gpu}/GPU, ${m.samples} samples`);
    return [`${e.parameter} ${e.previous_value} → ${e.value}`, ...per].join(" · ");
  }
  if (v.origin === "rollback") return `rolled back to v${e.rolled_back_to}`;
  return "";
}

function diffBlock(text) {
  if (!text) return h("p", { class: "muted", "data-testid": "template-diff" }, "The two versions are the same.");
  return h("pre", { class: "diff", "data-testid": "template-diff" }, text.split("\n").map((line) =>
    h("span", { class: line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del" : "" }, `${line}\n`)));
}

export function templateView(container, { arg: name, live }) {
  const head = h("div", { class: "page-head" }, h("h1", {}, name));
  const pinPanel = h("div", { class: "panel", "data-testid": "template-pin" });
  const historyBody = h("tbody", {});
  const fromSelect = h("select", { name: "from" });
  const toSelect = h("select", { name: "to" });
  const diffOut = h("div", {});
  const yaml = h("pre", { class: "json", "data-testid": "template-yaml" });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  let lastKey = "";

  const showDiff = async () => {
    try {
      const d = await get(withQuery(`/api/v1/templates/${encodeURIComponent(name)}/diff`,
        { from: fromSelect.value, to: toSelect.value }));
      diffOut.replaceChildren(diffBlock(d.diff));
    } catch (err) {
      diffOut.replaceChildren(h("p", { class: "error" }, err.message));
    }
  };
  container.append(head, error, pinPanel,
    h("div", { class: "panel" }, h("h2", {}, "History"),
      h("table", { "data-testid": "template-history" },
        h("thead", {}, h("tr", {}, ["Version", "Origin", "By", "When", "Reason", "Evidence", ""].map((c) => h("th", {}, c)))),
        historyBody)),
    h("div", { class: "panel" }, h("h2", {}, "Diff"),
      h("form", { class: "filters", onsubmit: (ev) => { ev.preventDefault(); showDiff(); } },
        h("label", {}, "From", fromSelect), h("label", {}, "To", toSelect),
        h("button", { type: "submit", class: "act", "data-action": "diff" }, "Show diff")),
      diffOut),
    h("div", { class: "panel" }, h("h2", {}, "Active version"), yaml));

  function rollback(version) {
    reasonDialog({
      action: "rollback", title: `Roll back ${name} to v${version}`, confirm: "Roll back",
      subject: `${name}: a new version with the text of v${version}`,
      hint: "The running templaters use it from their next need; a tuned template may be tuned again unless pinned.",
      send: (reason) => post(`/api/v1/templates/${encodeURIComponent(name)}/rollback`, { version, reason }),
      accepted: (saved) => { flash(`${name}: ${saved.note}`, { testid: "template-rolled-back" }); poll.refresh(); },
    });
  }

  function pin(pinned) {
    reasonDialog({
      action: pinned ? "pin" : "unpin", title: `${pinned ? "Pin" : "Unpin"} ${name}`,
      confirm: pinned ? "Pin" : "Unpin", subject: name,
      hint: pinned ? "The tuner leaves a pinned template alone (it logs what it would have done)."
        : "The tuner may make new versions of it again.",
      send: (reason) => post(`/api/v1/templates/${encodeURIComponent(name)}/${pinned ? "pin" : "unpin"}`, { reason }),
      accepted: (state) => {
        flash(`${name} ${state.pinned ? "pinned" : "unpinned"}`, { testid: "template-pinned" });
        poll.refresh();
      },
    });
  }

  function render(found, doc) {
    head.replaceChildren(h("h1", {}, name), h("span", { class: "sub" }, `active v${found.active_version}`));
    pinPanel.replaceChildren(
      found.pinned
        ? h("span", { "data-pinned": "true" }, "Pinned by ", h("b", {}, found.pinned_by), `: ${found.pin_reason} `)
        : h("span", { "data-pinned": "false" }, "Not pinned: the tuner may change it if it opts in to tuning. "),
      guarded("operator", { "data-action": found.pinned ? "unpin" : "pin", onclick: () => pin(!found.pinned),
        title: found.pinned ? "Let the tuner change it again" : "Keep the tuner away from it" },
      found.pinned ? "Unpin" : "Pin"));
    historyBody.replaceChildren(...found.versions.map((v) => h("tr", {
      "data-version": v.version, class: v.version === found.active_version ? "active" : "" },
    h("td", { class: "num" }, `v${v.version}`, v.version === found.active_version ? " (active)" : ""),
    h("td", {}, badge(v.origin)), h("td", {}, v.actor),
    h("td", { class: "nowrap", title: fmtTime(v.created_at) }, fmtAgo(v.created_at)),
    h("td", { class: "reason" }, v.reason), h("td", { class: "reason" }, evidenceLine(v)),
    h("td", { class: "actions" }, v.version === found.active_version ? null
      : guarded("admin", { "data-action": "rollback", onclick: () => rollback(v.version),
        title: `A new version with the text of v${v.version}` }, `Roll back to v${v.version}`)))));
    const options = found.versions.map((v) => `${v.version}`);
    const keep = [fromSelect.value, toSelect.value];
    fromSelect.replaceChildren(...options.map((o) => h("option", { value: o }, `v${o}`)));
    toSelect.replaceChildren(...options.map((o) => h("option", { value: o }, `v${o}`)));
    fromSelect.value = options.includes(keep[0]) ? keep[0] : options[Math.min(1, options.length - 1)];
    toSelect.value = options.includes(keep[1]) ? keep[1] : options[0];
    yaml.textContent = doc.yaml;
  }

  const poll = poller(async (signal) => {
    try {
      const found = await get(`/api/v1/templates/${encodeURIComponent(name)}/history`, { signal });
      const doc = await get(`/api/v1/templates/${encodeURIComponent(name)}`, { signal });
      error.hidden = true;
      const key = JSON.stringify([found, doc.sha256]);
      if (key !== lastKey) { lastKey = key; render(found, doc); }
    } catch (err) {
      error.textContent = `Could not load ${name}: ${err.message}`;
      error.hidden = false;
      throw err;
    }
  }, POLL_MS, live);
  return () => poll.stop();
}
