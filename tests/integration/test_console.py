"""The web console in a real browser: an operator pauses a running task from its page.

Everything is real: the control-plane services and the task store's recorder as processes on
the real broker and Redis, the API (uvicorn) on a SQLite store file, agents with a fault plan,
and Debian's Chromium driven headless by Playwright (never a downloaded browser).

The task's drain is held up deterministically as in test_operator_control: its node ignores
commands, so the drain step stays started. The operator signs in, finds the task in the live
list, opens it and pauses it with a reason; the page shows the pause waiting for the step;
a second pause is refused (409, shown in the dialog). The node then listens again, the
executor's deadline recovery completes the drain, and the task pauses at the step boundary:
the page shows it paused, and so does the store. A viewer opening the task is refused the
resume (403, shown in the dialog).

Every wait is for something the page or the bus shows, with a generous deadline (Playwright's
`expect` retries for up to WAIT_MS): a slow browser or a busy machine makes the test slower,
not red. The one thing that must come in order is the browser work before the drain's
deadline, so that deadline is long, and checked before the node listens again.

Set CONSOLE_SCREENSHOT_DIR to keep a screenshot of each page visited (docs/console/).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from playwright.async_api import Browser, Page, Playwright, async_playwright, expect

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import TaskEvent, now_utc
from schemas.topics import Topic
from services.shared.registry import register
from services.store.db import migrate, open_store
from services.store.queries import get_task, list_audit
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    ApiSite,
    Tap,
    is_up,
    name,
    services,
    short_drain_templates,
    stack_env,
    tap,
)
from warden import launcher

NODES = ["node-001", "node-002", "node-003"]
TARGET = "node-002"
# The drain's deadline (the built-in template's): the browser work (find, open, pause, see the
# pause wait, be refused a second one) must fit before it, since the node only listens again
# afterwards. That took 2-6 s on a shared 2-core machine; the deadline leaves ten times that,
# and the test checks it was not reached before letting the node listen (a clear failure,
# not a puzzle).
DRAIN_TIMEOUT_S = 60
OPERATOR_TOKEN = "console-operator-token-0123456789"
VIEWER_TOKEN = "console-viewer-token-0123456789"
REASON = "hold for the maintenance window"
MS = 1000
# How long an `expect` (and a page action) waits for its condition: Playwright's 5 s default
# is a speed assertion on a busy machine. Set for every `expect` of the process (the console
# tests are the only users).
WAIT_MS = 60 * MS
expect.set_options(timeout=WAIT_MS)


@dataclass
class Console:
    """Debian's Chromium, headless, for the console tests: every page waits as long as an
    `expect` does, and a script error on any page fails the test when the browser closes."""

    browser: Browser
    errors: list[str] = field(default_factory=list)

    @classmethod
    async def launch(cls, pw: Playwright, chromium: str) -> Console:
        return cls(await pw.chromium.launch(executable_path=chromium, headless=True,
                                            args=["--no-sandbox"]))

    async def page(self) -> Page:
        page = await self.browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda err: self.errors.append(str(err)))
        return page

    async def close(self) -> None:
        assert not self.errors, self.errors
        await self.browser.close()


async def wait_healthy(base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            try:
                if (await client.get(f"{base}/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the API at {base} not healthy after {timeout_s}s")
            await asyncio.sleep(0.2)


def screenshot_path(label: str) -> Path | None:
    if folder := os.getenv("CONSOLE_SCREENSHOT_DIR"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        return Path(folder) / f"{label}.png"
    return None


async def screenshot(page: Page, label: str) -> None:
    """Keep the page for the README when CONSOLE_SCREENSHOT_DIR says where."""
    if path := screenshot_path(label):
        await page.screenshot(path=str(path), full_page=True)


def events_of(watch: Tap, task_id: UUID) -> list[TaskEvent]:
    return [e for e in (TaskEvent.model_validate_json(r.value) for r in watch.records
                        if r.topic.endswith(Topic.OPS_TASK_EVENTS.value))
            if e.task_id == task_id]


@pytest.mark.timeout(900)  # the waits' own deadlines, not this, are what should fail
async def test_an_operator_pauses_a_running_task_in_the_console(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, chromium: str
) -> None:
    site = ApiSite.at(tmp_path)
    base, database_url = site.base, site.database_url
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]',
        TEMPLATER_TEMPLATE_DIR=str(short_drain_templates(tmp_path / "templates", DRAIN_TIMEOUT_S)),
        # Agents that ignore commands must not also fail the centre's probes meanwhile.
        COLLECTOR_PROBE_PERIOD_S="3600",
        **site.env(f"{OPERATOR_TOKEN}:olivia:operator,{VIEWER_TOKEN}:vic:viewer"),
        **SMALL_POOL_SAFETY,
    )
    # Migrated once here: the recorder and the API would otherwise both create the schema of
    # the same new file at the same moment.
    await migrate(database_url)
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, (*launcher.SERVICES, launcher.API)):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_TASK_EVENTS, namespace)) as watch, \
                    async_playwright() as pw:
                await wait_healthy(base, 120)
                console = await Console.launch(pw, chromium)
                page = await console.page()

                # Sign in: the token is asked for once and kept in the browser.
                await page.goto(f"{base}/")
                await page.fill("#token", OPERATOR_TOKEN)
                await page.click("#login-button")
                await expect(page.get_by_test_id("tasks-table")).to_be_visible()
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")

                fleet.inject_fault(tmp_path, TARGET, ignore_commands=True)
                fleet.inject_fault(tmp_path, TARGET, xid=[79])

                # The live list picks the task up by itself (it polls); open it from there.
                row = page.locator('tr[data-state="running"]', has_text=TARGET)
                await expect(row).to_be_visible(timeout=180 * MS)
                task_id = UUID(await row.get_attribute("data-task-id") or "")
                await screenshot(page, "tasks")
                await row.get_by_test_id("task-link").click()
                state = page.get_by_test_id("task-state").locator(".badge")
                await expect(state).to_have_text("running")
                await expect(page.locator('[data-step="0"]')).to_have_attribute(
                    "data-state", "started")

                # Pause, with a reason.
                await page.get_by_test_id("task-actions").locator(
                    'button[data-action="pause"]').click()
                await page.fill("#action-reason", REASON)
                await page.click("#action-confirm")
                await expect(page.get_by_test_id("control-accepted")).to_contain_text(
                    "pauses when the running step ends")
                # The executor acknowledged it: the page says the pause waits for the step.
                await expect(page.get_by_test_id("pending-control")).to_contain_text(
                    "Pause requested by olivia")
                await expect(state).to_have_text("running")

                # A second pause is illegal now: the API's 409 and its reason, in the dialog.
                await page.get_by_test_id("task-actions").locator(
                    'button[data-action="pause"]').click()
                await page.fill("#action-reason", "again")
                await page.click("#action-confirm")
                refusal = page.locator("#action-error")
                await expect(refusal).to_be_visible()
                await expect(refusal).to_contain_text("409")
                await expect(refusal).to_contain_text("a pause is already requested")
                await page.click("#action-cancel")

                # All that happened before the drain's deadline: the executor has not asked
                # the node about its drain yet (were it to ask now, the node would not answer
                # and the drain would fail instead of completing).
                await watch.catch_up()
                started = next(e for e in events_of(watch, task_id)
                               if e.step_index == 0 and e.step_state == "started")
                asked = [e.reason for e in events_of(watch, task_id)
                         if "asked the agent for the status" in e.reason]
                browser_s = (now_utc() - started.occurred_at).total_seconds()
                print(f"\nbrowser work: {browser_s:.1f} s of the drain's {DRAIN_TIMEOUT_S} s")
                assert not asked, (f"the browser work outlasted the drain's deadline "
                                   f"({DRAIN_TIMEOUT_S} s): {asked}")

                # The node listens again; the drain completes on the executor's deadline
                # recovery, and the task pauses at the step boundary.
                fleet.inject_fault(tmp_path, TARGET, ignore_commands=False)
                await expect(state).to_have_text("paused", timeout=(DRAIN_TIMEOUT_S + 120) * MS)
                await expect(page.locator('[data-step="0"]')).to_have_attribute(
                    "data-state", "completed")
                await expect(page.get_by_test_id("task-actions").locator(
                    'button[data-action="resume"]')).to_be_visible()
                await screenshot(page, "task")
                # The other pages, once they show their data (for the screenshots).
                loaded = {
                    "cluster": page.locator('[data-view="cluster"] [data-testid="heatmap"] '
                                            '.tile'),
                    "capacity": page.locator('[data-view="capacity"] [data-testid='
                                             '"capacity-chart"] :is(svg, .empty)'),
                }
                for route, shown in loaded.items():
                    await page.goto(f"{base}/#/{route}")
                    await expect(page.locator(f'[data-view="{route}"]')).to_be_visible()
                    await expect(shown.first).to_be_visible()
                    if route == "cluster":
                        await expect(shown).to_have_count(len(NODES))
                    await screenshot(page, route)

                # A viewer sees the task but may not act on it: the API's 403, in the dialog
                # (or, where the API names the caller's role, the button is disabled).
                viewer = await console.page()
                await viewer.goto(f"{base}/#/task/{task_id}")
                await viewer.fill("#token", VIEWER_TOKEN)
                await viewer.click("#login-button")
                await expect(viewer.get_by_test_id("task-state").locator(".badge")).to_have_text(
                    "paused")
                resume = viewer.get_by_test_id("task-actions").locator(
                    'button[data-action="resume"]')
                refused_by_api = await resume.is_enabled()
                if refused_by_api:
                    await resume.click()
                    await viewer.fill("#action-reason", "not mine to resume")
                    await viewer.click("#action-confirm")
                    await expect(viewer.locator("#action-error")).to_contain_text("403")
                    await expect(viewer.locator("#action-error")).to_contain_text(
                        "needs the operator role")
                else:
                    assert "operator" in (await resume.get_attribute("title") or "")
                await console.close()

            # The store has it paused, by the operator, with the reason; and the audit log
            # holds the accepted pause, the refused one and the viewer's refused resume.
            store = open_store(database_url)
            try:
                async with store.session() as session:
                    task = await get_task(session, task_id)
                    audit, _ = await list_audit(session, 100, 0)
            finally:
                await store.close()
            assert task is not None
            assert (task.state, task.target, task.current_step) == ("paused", TARGET, 1)
            stop = next(t for t in task.transitions if t.state == "paused")
            assert (stop.actor, stop.reason, stop.previous_state) == (
                "olivia", f"pause: {REASON}", "running")
            pauses = [(a.actor, a.reason, a.result) for a in audit if a.action == "pause"]
            assert ("olivia", REASON, "accepted") in pauses, pauses
            assert any(result.startswith("409") for _, _, result in pauses), pauses
            if refused_by_api:
                assert any(a.actor == "vic" and a.result == "403" for a in audit), audit
        finally:
            fleet.fleet_down(tmp_path)
