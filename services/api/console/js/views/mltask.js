// One ML task (GET /api/v1/ml/tasks/{id}, every 2 s): its input, and each attempt with the
// decision behind it — every candidate the selector looked at, with its statistics, whether it
// was eligible and why, and its score, the chosen one highlighted — and how the attempt ended.

import { ApiError, get } from "../api.js";
import { badge, fmtAgo, fmtDuration, fmtTime, h, kv, since } from "../dom.js";
import { poller } from "../poll.js";
import { armText, fmtMs, fmtNum, intervalBar, outcomeCell } from "./mltasks.js";

const POLL_MS = 2000;
const REDRAW_MS = 10000;
const FINAL = new Set(["succeeded", "failed"]);
const DIGIT_PIXELS = 64;
const PIXEL_MAX = 16;

const num = fmtNum;

/** Whether candidate `c` (model "name:version", node) is the one the attempt chose. */
export function isChosen(attempt, c) {
  return Boolean(attempt.model) && c.node === attempt.node_id
    && c.model === `${attempt.model}:${attempt.version}`;
}

/** The verdict column: chosen, eligible (passed over) or not eligible. */
function verdict(attempt, c) {
  if (isChosen(attempt, c)) return badge("chosen", attempt.probe ? "chosen (probe)" : "chosen");
  return c.eligible ? badge("eligible") : badge("ineligible", "not eligible");
}


function candidatesTable(attempt) {
  if (!attempt.candidates.length) return h("p", { class: "muted" }, "The decision had no candidates.");
  return h("table", { class: "candidates", "data-testid": "candidates" },
    h("thead", {}, h("tr", {},
      ["Arm", "Family", "State", "Mean", "Lower – upper", "", "n_eff", "In flight", "Latency", "Sample", "Score", "Verdict", "Reason"]
        .map((c) => h("th", {}, c)))),
    h("tbody", {}, attempt.candidates.map((c) => {
      const chosen = isChosen(attempt, c);
      return h("tr", {
        class: [chosen && "chosen", !c.eligible && "ineligible"],
        "data-arm": c.arm, "data-chosen": chosen ? "true" : "false",
      },
      h("td", { class: "mono", title: c.arm }, chosen ? h("span", { class: "marker", "aria-label": "chosen" }, "▶ ") : null,
        `${c.model}@${c.node}`),
      h("td", {}, c.family, h("span", { class: "muted", title: "fallback group (0 first)" }, ` · g${c.group}`)),
      h("td", {}, badge(c.state)),
      h("td", { class: "num" }, num(c.mean)),
      h("td", { class: "num nowrap" }, `${num(c.lower)} – ${num(c.upper)}`),
      h("td", { class: "bar-cell" }, intervalBar(c)),
      h("td", { class: "num", title: `alpha ${num(c.alpha)}, beta ${num(c.beta)}; prior ${num(c.prior_mean)} (model ${num(c.model_mean)}, node ${num(c.node_mean)})` }, num(c.n_eff, 2)),
      h("td", { class: "num" }, `${c.inflight} / ${c.limit}`),
      h("td", { class: "num nowrap", title: `on time ${num(c.on_time)}` }, c.latency_s ? fmtMs(c.latency_s * 1000) : "—"),
      h("td", { class: "num" }, num(c.sample)),
      h("td", { class: "num", "data-testid": "score" }, num(c.score, 4)),
      h("td", {}, verdict(attempt, c), c.avoided ? h("div", { class: "muted", title: "the retry avoids this arm (1: its node or model, 2: the arm itself)" }, `avoided ${c.avoided}`) : null),
      h("td", { class: "reason" }, c.reason));
    })));
}

function attemptCard(task, attempt) {
  const ended = attempt.outcome !== null && attempt.outcome !== undefined;
  const chosenText = attempt.model ? armText(attempt.model, attempt.version, attempt.node_id) : "nothing chosen";
  return h("section", {
    class: ["panel", "attempt", attempt.outcome], "data-attempt": attempt.attempt,
    "data-outcome": attempt.outcome || "", "data-testid": "attempt",
  },
  h("div", { class: "step-title" },
    h("h2", {}, `Attempt ${attempt.attempt}`),
    badge(attempt.status),
    attempt.probe ? badge("half_open", "half-open probe") : null,
    h("span", { class: "mono", "data-testid": "attempt-chosen" }, chosenText),
    attempt.family ? h("span", { class: "muted" }, attempt.family) : null,
    ended ? badge(attempt.outcome) : (FINAL.has(task.state) ? null : badge("running", "waiting for the answer"))),
  h("div", { class: "grid2 attempt-facts" },
    h("div", {}, h("h3", {}, "Decision"),
      kv([
        ["Decided", attempt.decided_at ? fmtTime(attempt.decided_at) : "—"],
        ["Why", attempt.decision_reason || "—"],
        ["Command", attempt.command_id ? h("code", { title: attempt.command_id }, attempt.command_id) : "—"],
      ], "kv compact")),
    h("div", {}, h("h3", {}, "Outcome"),
      ended ? kv([
        ["Answer", attempt.prediction !== null && attempt.prediction !== undefined
          ? `${attempt.prediction}${attempt.confidence !== null ? ` (confidence ${(attempt.confidence * 100).toFixed(1)}%)` : ""}`
          : (attempt.cause || "—").replace(/_/g, " ")],
        ["Counted against", attempt.attributed_to || (attempt.outcome === "succeeded" ? "— (a success)" : "—")],
        ["Latency", `${fmtMs(attempt.latency_ms)} (on the node ${fmtMs(attempt.node_latency_ms)})`],
        ["Ended", `${fmtTime(attempt.ended_at)}${attempt.decided_at ? ` after ${fmtDuration(since(attempt.decided_at, attempt.ended_at))}` : ""}`],
        ["Reason", attempt.reason || "—"],
      ], "kv compact") : h("p", { class: "muted" }, "No answer yet."))),
  h("h3", {}, `Candidates (${attempt.candidates.length})`),
  candidatesTable(attempt));
}

/** An 8x8 digit drawn from its 64 pixel counts (0..16), darker for more ink. */
function digitImage(values) {
  return h("div", { class: "digit", "aria-label": "the input digit", role: "img" },
    values.map((v) => {
      const ink = Math.min(1, Math.max(0, v / PIXEL_MAX));
      const grey = Math.round(255 * (1 - ink));
      return h("span", { style: { backgroundColor: `rgb(${grey},${grey},${grey})` }, title: String(v) });
    }));
}

function inputBlock(task) {
  if (!task.input) return h("p", { class: "muted" }, "The submission has not been recorded (only later events were).");
  const isDigit = task.task_type === "digits" && task.input.length === DIGIT_PIXELS;
  return h("div", { class: "ml-input" },
    isDigit ? digitImage(task.input) : null,
    h("details", {}, h("summary", {}, `${task.input.length} numbers`),
      h("pre", { class: "json" }, JSON.stringify(task.input))));
}

function render(container, task) {
  container.replaceChildren(
    h("div", { class: "panel" },
      h("div", { class: "detail-head" },
        h("div", {},
          h("h1", {}, `${task.task_type || "ML task"} · ${armText(task.model, task.version, task.node_id)}`,
            h("span", { "data-testid": "ml-task-state" }, badge(task.state)),
            task.critical ? badge("critical") : null),
          h("div", { class: "mono muted" }, task.task_id)),
        h("div", { class: "ml-answer", "data-testid": "ml-task-outcome" }, outcomeCell(task))),
      h("p", { "data-testid": "ml-task-reason" }, task.reason),
      h("div", { class: "grid2" },
        kv([
          ["Cluster", task.cluster_id],
          ["Task type", task.task_type ?? "—"],
          ["Priority", task.priority ?? "—"],
          ["Critical", task.critical ? "yes (a pessimistic bound chooses)" : "no"],
          ["Submitted by", task.submitted_by ?? "—"],
          ["Deadline", task.deadline ? fmtTime(task.deadline) : "—"],
          ["Attempts", task.attempts],
          ["Model", task.model ? `${task.model}:${task.version} (${task.family})` : "—"],
          ["Node", task.node_id ?? "—"],
          ["Latency", fmtMs(task.latency_ms)],
          ["Created", fmtTime(task.created_at)],
          ["Updated", `${fmtTime(task.updated_at)} (${fmtAgo(task.updated_at)})`],
          ["Finished", task.finished_at ? `${fmtTime(task.finished_at)} after ${fmtDuration(since(task.created_at, task.finished_at))}` : "—"],
        ]),
        h("div", {}, h("h3", {}, "Input"), inputBlock(task)))),
    h("h2", { class: "section-title" }, `Attempts (${task.attempt_list.length})`),
    task.attempt_list.length
      ? h("div", { "data-testid": "attempts" }, task.attempt_list.map((a) => attemptCard(task, a)))
      : h("p", { class: "panel muted" }, "No decision yet: the router has not chosen a model."));
}

export function mlTaskView(container, { arg, live }) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  container.append(
    h("div", { class: "page-head" }, h("a", { href: "#/ml" }, "‹ ML tasks"),
      h("a", { href: "#/models" }, "Models")),
    body);
  let lastKey = "";
  let lastDrawn = 0;
  const poll = poller(async (signal) => {
    try {
      const task = await get(`/api/v1/ml/tasks/${encodeURIComponent(arg)}`, { signal });
      const key = JSON.stringify(task);
      if (key === lastKey && Date.now() - lastDrawn < REDRAW_MS) return;
      lastKey = key;
      lastDrawn = Date.now();
      const open = [...body.querySelectorAll("details")].map((d) => d.open);
      render(body, task);
      body.querySelectorAll("details").forEach((d, i) => { if (open[i]) d.open = true; });
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 422)) {
        // Just submitted: the store records it within a second or so; the page keeps asking.
        body.replaceChildren(h("p", { class: err.status === 404 ? "notice" : "error", "data-testid": "ml-task-missing" },
          err.status === 404 ? `${err.message} (yet: a submission is recorded once the store has it)`
            : `No ML task ${arg}: ${err.message}`));
        lastKey = "";
        return;
      }
      throw err;
    }
  }, POLL_MS, live);
  return () => poll.stop();
}
