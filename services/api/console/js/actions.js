// Operator interventions: pause, resume, retry, terminate, restart (operator) and jump (admin), each
// asking for a reason in a dialog (as acknowledging an alert does, views/alerts.js). The API
// checks the task's recorded state and answers 409 with the reason when the control is
// illegal, 403 when the role is missing; both are shown in the dialog, next to the reason the
// operator typed, so nothing is lost.

import { ApiError, errorLine, post } from "./api.js";
import { h, shortId } from "./dom.js";

const RANK = { viewer: 0, operator: 1, admin: 2 };

/** Who is signed in: {user, role}, or role null when the API does not say (GET /api/v1/me). */
export const session = { user: null, role: null };

export const ACTIONS = {
  pause: {
    label: "Pause", role: "operator",
    states: ["created", "queued", "dispatched", "running"],
    hint: "A running step finishes first: the task pauses at the next step boundary.",
  },
  resume: {
    label: "Resume", role: "operator", states: ["paused"],
    hint: "The task carries on from the step where it paused.",
  },
  retry: {
    label: "Retry", role: "operator", states: ["failed"],
    hint: "The task runs again from its failed step.",
  },
  terminate: {
    label: "Terminate", role: "operator", danger: true,
    states: ["created", "queued", "dispatched", "running", "paused"],
    hint: "Final: a running command is cancelled on its node and the task's locks are released.",
  },
  restart: {
    label: "Restart", role: "operator", states: ["failed", "terminated"],
    hint: "The task runs again from its first step, under a new epoch; its open children are terminated.",
  },
  jump: {
    label: "Jump…", role: "admin", states: ["paused", "failed"],
    hint: "The task moves to the chosen step and stays paused there until resumed.",
  },
};

/** Whether the signed-in role may do what needs `needed`. */
export function roleAllows(needed) {
  // Unknown role (no /api/v1/me): offer the action and let the API answer 403 if need be.
  return session.role === null || RANK[session.role] >= RANK[needed];
}

/** The actions worth offering for a task in `state` (the API has the final word). */
export function actionsFor(state) {
  return Object.entries(ACTIONS)
    .filter(([name, a]) => a.states.includes(state) && (name !== "jump" || roleAllows("admin")))
    .map(([name]) => name);
}

/** Buttons for a task's actions; `onDone` runs after an accepted control. */
export function actionButtons(task, onDone, { small = true } = {}) {
  return actionsFor(task.state).map((name) => {
    const a = ACTIONS[name];
    const allowed = roleAllows(a.role);
    return h("button", {
      type: "button",
      class: ["act", small && "small", a.danger && "danger"],
      "data-action": name,
      disabled: !allowed,
      title: allowed ? a.hint : `needs the ${a.role} role; you are ${session.role}`,
      onclick: (ev) => { ev.stopPropagation(); openDialog(task, name, onDone); },
    }, a.label);
  });
}

let flashArea = null;

/** A message at the bottom right; errors stay until dismissed, others for 12 s. */
export function flash(text, { bad = false, testid } = {}) {
  flashArea = flashArea || document.getElementById("flash");
  const msg = h("div", { class: ["msg", bad && "bad"], role: bad ? "alert" : "status", "data-testid": testid },
    h("span", {}, text),
    h("button", { type: "button", "aria-label": "dismiss", onclick: () => msg.remove() }, "×"));
  flashArea.append(msg);
  if (!bad) setTimeout(() => msg.remove(), 12000);
  return msg;
}

function describe(task) {
  const what = [task.kind || task.need_kind || "task", task.target].filter(Boolean).join(" · ");
  return `${what} — ${shortId(task.task_id)} (${task.state})`;
}

function openDialog(task, action, onDone) {
  const a = ACTIONS[action];
  const steps = action !== "jump" ? null
    : (task.steps && task.steps.length ? task.steps
      : Array.from({ length: task.step_count || 0 }, (_, index) => ({ index })));
  const label = a.label.replace("…", "");
  reasonDialog({
    action, title: `${label} task`, subject: describe(task), hint: a.hint, confirm: label,
    danger: a.danger, steps,
    send: (reason, stepIndex) => {
      const body = { reason };
      if (action === "jump") body.step_index = stepIndex;
      return post(`/api/v1/tasks/${encodeURIComponent(task.task_id)}/${action}`, body);
    },
    accepted: (accepted) => {
      flash(`${label} of ${shortId(task.task_id)} accepted: ${accepted.note || accepted.expected_state}`,
        { testid: "control-accepted" });
      if (onDone) onDone(accepted);
    },
  });
}

/**
 * The reason dialog of every intervention: `send(reason, stepIndex)` makes the call and
 * `accepted(result)` runs once it is accepted. A refusal (409 illegal now, 403 role, 404, 422
 * reason, 503 Kafka) is shown in the dialog, which stays open with the reason typed.
 * `steps` (a jump's) adds the step choice.
 */
export function reasonDialog({ action, title, subject, hint, confirm: confirmText, danger, steps, send, accepted }) {
  const dialog = document.getElementById("action-dialog");
  const form = document.getElementById("action-form");
  const reason = document.getElementById("action-reason");
  const error = document.getElementById("action-error");
  const confirm = document.getElementById("action-confirm");
  const stepLabel = document.getElementById("action-step-label");
  const stepSelect = document.getElementById("action-step");

  document.getElementById("action-title").textContent = title;
  document.getElementById("action-task").textContent = subject;
  document.getElementById("action-hint").textContent = hint;
  confirm.textContent = confirmText;
  confirm.disabled = false;
  confirm.className = danger ? "danger" : "";
  dialog.dataset.action = action;
  reason.value = "";
  error.hidden = true;
  error.textContent = "";
  stepLabel.hidden = !steps;
  if (steps) {
    stepSelect.replaceChildren(...steps.map((st) =>
      h("option", { value: st.index }, `#${st.index}${st.name ? ` ${st.name}` : ""}${st.action ? ` (${st.action})` : ""}`)));
  }

  const submit = async (ev) => {
    ev.preventDefault();
    const text = reason.value.trim();
    if (!text) {
      error.textContent = "A reason is required (1–500 characters).";
      error.hidden = false;
      reason.focus();
      return;
    }
    confirm.disabled = true;
    error.hidden = true;
    try {
      const result = await send(text, steps ? Number(stepSelect.value) : undefined);
      close();
      accepted(result);
    } catch (err) {
      error.textContent = errorLine(err);
      error.dataset.status = err instanceof ApiError ? String(err.status) : "";
      error.hidden = false;
      confirm.disabled = false;
    }
  };
  const cancel = () => close();
  function close() {
    form.removeEventListener("submit", submit);
    document.getElementById("action-cancel").removeEventListener("click", cancel);
    if (dialog.open) dialog.close();
  }
  form.addEventListener("submit", submit);
  document.getElementById("action-cancel").addEventListener("click", cancel);
  dialog.addEventListener("close", () => {
    form.removeEventListener("submit", submit);
    document.getElementById("action-cancel").removeEventListener("click", cancel);
  }, { once: true });
  dialog.showModal();
  reason.focus();
}
