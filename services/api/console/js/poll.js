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
