// The number of firing alerts beside "Alerts" in the nav (GET /api/v1/alerts?status=firing), red
// while any of them is unacknowledged. It polls while someone is signed in, on every page.

import { get, withQuery } from "./api.js";
import { poller } from "./poll.js";

const POLL_MS = 10000;
// The API's largest page: beyond it the count is still right, the unacknowledged part a floor.
const PAGE = 500;

let poll = null;

function show(total, unacknowledged) {
  const el = document.getElementById("alerts-count");
  if (!el) return;
  el.hidden = !total;
  el.textContent = String(total);
  el.classList.toggle("quiet", unacknowledged === 0);
  el.title = `${total} alert${total === 1 ? "" : "s"} firing, ${unacknowledged} not acknowledged`;
}

export const alertCount = {
  start() {
    if (poll) return;
    poll = poller(async (signal) => {
      const page = await get(withQuery("/api/v1/alerts", { status: "firing", limit: PAGE }), { signal });
      show(page.total, page.items.filter((a) => !a.acknowledged_by).length);
    }, POLL_MS);
  },
  /** At once, e.g. after an acknowledgement. */
  refresh() {
    if (poll) poll.refresh();
  },
  stop() {
    if (poll) poll.stop();
    poll = null;
    show(0, 0);
  },
};
