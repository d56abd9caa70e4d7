// Operator interventions: pause, resume, retry, terminate (operator) and jump (admin), each
// asking for a reason in a dialog. The API checks the task's recorded state and answers 409
// with the reason when the control is illegal, 403 when the role is missing; both are shown in
// the dialog, next to the reason the operator typed, so nothing is lost.

import { ApiError, errorLine, post } from "./api.js";
import { h, shortId } from "./dom.js";

const RANK = { viewer: 0, operator: 1, admin: 2 };

/** Who is signed in: {user, role}, or role null when the API does not say (GET /api/me). */
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
  jump: {
    label: "Jump…", role: "admin", states: ["paused", "failed"],
    hint: "The task moves to the chosen step and stays paused there until resumed.",
  },
};

function roleAllows(needed) {
  // Unknown role (no /api/me): offer the action and let the API answer 403 if need be.
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
  const dialog = document.getElementById("action-dialog");
  const form = document.getElementById("action-form");
  const reason = document.getElementById("action-reason");
  const error = document.getElementById("action-error");
  const confirm = document.getElementById("action-confirm");
  const stepLabel = document.getElementById("action-step-label");
  const stepSelect = document.getElementById("action-step");
  const a = ACTIONS[action];

  document.getElementById("action-title").textContent = `${a.label.replace("…", "")} task`;
  document.getElementById("action-task").textContent = describe(task);
  document.getElementById("action-hint").textContent = a.hint;
  confirm.textContent = a.label.replace("…", "");
  confirm.disabled = false;
  confirm.className = a.danger ? "danger" : "";
  dialog.dataset.action = action;
  reason.value = "";
  error.hidden = true;
  error.textContent = "";

  stepLabel.hidden = action !== "jump";
  if (action === "jump") {
    const steps = task.steps && task.steps.length ? task.steps
      : Array.from({ length: task.step_count || 0 }, (_, index) => ({ index }));
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
    const body = { reason: text };
    if (action === "jump") body.step_index = Number(stepSelect.value);
    confirm.disabled = true;
    error.hidden = true;
    try {
      const accepted = await post(`/api/tasks/${encodeURIComponent(task.task_id)}/${action}`, body);
      close();
      flash(`${a.label.replace("…", "")} of ${shortId(task.task_id)} accepted: ${accepted.note || accepted.expected_state}`,
        { testid: "control-accepted" });
      if (onDone) onDone(accepted);
    } catch (err) {
      // 409 (illegal now), 403 (role), 422 (reason), 503 (Kafka): shown here, the dialog stays.
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
