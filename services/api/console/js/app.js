// The console: a single page with hash routes, each page a view that polls the JSON API.
//   #/tasks?state=running&node=...   tasks (live list, filters, actions)
//   #/task/<id>                      one task (steps, transitions, evidence, children)
//   #/cluster                        node heatmap and node states per pool
//   #/capacity?cluster=&pool=        utilisation history, range band and forecast
//   #/ml?state=&task_type=...        ML tasks (live list, filters, submission)
//   #/mltask/<id>                    one ML task (attempts, each decision's candidates)
//   #/models?cluster=                the models each node serves, with live statistics
//   #/alerts?status=firing           alerts, firing first; acknowledge one (operator)
//   #/templates                      templates: active version, origin, pin
//   #/template/<name>                one template: history, diff, rollback, pin / unpin

import { ApiError, clearToken, get, getToken, onUnauthorised, setToken, errorLine } from "./api.js";
import { session } from "./actions.js";
import { alertCount } from "./alertcount.js";
import { h } from "./dom.js";
import { parseHash } from "./router.js";
import { tasksView } from "./views/tasks.js";
import { taskView } from "./views/task.js";
import { clusterView } from "./views/cluster.js";
import { capacityView } from "./views/capacity.js";
import { mlTasksView } from "./views/mltasks.js";
import { mlTaskView } from "./views/mltask.js";
import { modelsView } from "./views/models.js";
import { alertsView } from "./views/alerts.js";
import { templatesView, templateView } from "./views/templates.js";

const ROUTES = {
  tasks: tasksView,
  task: taskView,
  cluster: clusterView,
  capacity: capacityView,
  ml: mlTasksView,
  mltask: mlTaskView,
  models: modelsView,
  alerts: alertsView,
  templates: templatesView,
  template: templateView,
};
// A detail page lights its list's tab.
const PARENT = { task: "tasks", mltask: "ml", template: "templates" };

const main = () => document.getElementById("main");
let current = null; // the mounted view's dispose function

function unmount() {
  if (current) {
    try { current(); } catch (err) { console.error(err); }
    current = null;
  }
}

function route() {
  unmount();
  if (!getToken()) {
    showLogin();
    return;
  }
  showChrome(true);
  alertCount.start();
  const { name, arg, params } = parseHash();
  for (const a of document.querySelectorAll("#nav a")) {
    const r = a.dataset.route;
    a.classList.toggle("active", r === name || r === PARENT[name]);
  }
  const view = ROUTES[name] || tasksView;
  const container = h("div", { class: "view", "data-view": name });
  main().replaceChildren(container);
  current = view(container, { arg, params, live: liveIndicator });
}

function showChrome(signedIn) {
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("logout").hidden = !signedIn;
  document.getElementById("live").hidden = !signedIn;
  const who = document.getElementById("who");
  who.hidden = !signedIn || !session.user;
  if (session.user) {
    who.replaceChildren("Signed in as ", h("b", {}, session.user), session.role ? ` (${session.role})` : "");
  }
}

/** The top bar's "updated 2 s ago" / "API unreachable" note, fed by every poll. */
const liveIndicator = {
  ok() {
    const el = document.getElementById("live");
    el.classList.remove("stale");
    el.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  },
  failed(err) {
    const el = document.getElementById("live");
    el.classList.add("stale");
    el.textContent = `not updated: ${errorLine(err)}`;
  },
};

/** Who the token belongs to; the role decides which actions are offered. */
async function whoAmI() {
  try {
    const me = await get("/api/v1/me");
    session.user = me.user || null;
    session.role = me.role || null;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) throw err;
    // An API without /api/v1/me: offer every action and let it answer 403 where the role lacks.
    session.user = null;
    session.role = null;
  }
  // Any other endpoint proves the token is good where /api/v1/me does not exist.
  if (!session.user) await get("/api/v1/tasks?limit=1");
}

function showLogin(message) {
  showChrome(false);
  const input = h("input", {
    type: "password", id: "token", name: "token", autocomplete: "off", spellcheck: "false",
    placeholder: "paste your API token", required: true,
  });
  const error = h("p", { class: "error", role: "alert", hidden: !message }, message || "");
  const button = h("button", { type: "submit", id: "login-button" }, "Sign in");
  const form = h("form", {
    class: "panel login", id: "login",
    onsubmit: async (ev) => {
      ev.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      button.disabled = true;
      error.hidden = true;
      setToken(token);
      try {
        await whoAmI();
        if (!location.hash || location.hash === "#" || location.hash.startsWith("#/login")) location.hash = "#/tasks";
        route();
      } catch (err) {
        clearToken();
        error.textContent = err instanceof ApiError && err.status === 401
          ? "This token was not accepted." : `Could not sign in: ${errorLine(err)}`;
        error.hidden = false;
        button.disabled = false;
      }
    },
  },
  h("h1", {}, "Sign in"),
  h("p", { class: "muted" },
    "Paste a bearer token (an administrator makes one with ",
    h("code", {}, "warden api token --user NAME --role operator"),
    "). It is kept in this browser's local storage until you sign out."),
  h("label", {}, "API token", input),
  error,
  h("div", { class: "buttons" }, button));
  main().replaceChildren(form);
  input.focus();
}

function signOut(message) {
  unmount();
  alertCount.stop();
  clearToken();
  session.user = null;
  session.role = null;
  showLogin(message);
}

async function start() {
  document.getElementById("logout").addEventListener("click", () => signOut());
  // Only for a mounted page: during sign-in the form itself reports the refused token.
  onUnauthorised(() => { if (current) signOut("The API no longer accepts this token; sign in again."); });
  window.addEventListener("hashchange", route);
  if (getToken()) {
    try {
      await whoAmI();
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        signOut("The stored token is no longer accepted; sign in again.");
        return;
      }
      // The API is down: show the page anyway; its polls say so and recover when it is back.
    }
  }
  route();
}

start();
