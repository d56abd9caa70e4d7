// Polling for live pages: one request at a time (the next starts `intervalMs` after the last
// one ended, so a slow API is never flooded), none while the tab is hidden, and an immediate
// refresh when it is shown again or when the page asks (after an action, a filter change).

export function poller(fn, intervalMs, live) {
  let timer = null;
  let stopped = false;
  let running = false;
  let again = false;
  let controller = null;

  async function tick() {
    clearTimeout(timer);
    timer = null;
    if (stopped) return;
    if (running) { again = true; return; }
    if (document.hidden) { schedule(); return; }
    running = true;
    controller = new AbortController();
    try {
      await fn(controller.signal);
      if (live && !stopped) live.ok();
    } catch (err) {
      if (err && err.name === "AbortError") return;
      if (live && !stopped) live.failed(err);
    } finally {
      running = false;
      controller = null;
    }
    if (again) { again = false; tick(); } else schedule();
  }

  function schedule() {
    if (!stopped) timer = setTimeout(tick, intervalMs);
  }

  function onVisible() {
    if (!document.hidden) tick();
  }

  document.addEventListener("visibilitychange", onVisible);
  tick();
  return {
    refresh: tick,
    stop() {
      stopped = true;
      clearTimeout(timer);
      if (controller) controller.abort();
      document.removeEventListener("visibilitychange", onVisible);
    },
  };
}

// A poller for a paged list: fetch `url()`, redraw only when the page or the filters changed
// (so a click on a row's button is never lost to a redraw), and every `redrawMs` anyway so
// that the "… ago" times move on. A failure is shown in `error` (a 422 names the bad filter,
// e.g. a node id with a space); the table keeps its rows.
export function listPoller({ url, filters, render, error, what, get, intervalMs, redrawMs, live }) {
  let lastKey = "";
  let lastDrawn = 0;
  return poller(async (signal) => {
    try {
      const page = await get(url(), { signal });
      error.hidden = true;
      const key = JSON.stringify([filters, page]);
      if (key !== lastKey || Date.now() - lastDrawn > redrawMs) {
        render(page);
        lastKey = key;
        lastDrawn = Date.now();
      }
    } catch (err) {
      if (err.name !== "AbortError") {
        error.textContent = `Could not load ${what}: ${err.status ? `${err.status} ` : ""}${err.message}`;
        error.hidden = false;
      }
      throw err;
    }
  }, intervalMs, live);
}
