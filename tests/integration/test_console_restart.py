"""The web console in a real browser: an operator restarts a failed task from its page.

Everything is real, as in test_console: the services and the store's recorder as processes on
the real broker and Redis, the API on a SQLite store file, agents with a fault plan, and
Debian's Chromium driven headless by Playwright.

node-002's agent fails `offline_node` (its fault plan), so the node's offline task fails at
its second step with the node drained. The plan is cleared; the operator opens the failed task
in the console, where Restart is offered (and Retry), restarts it with a reason, and the page
says who restarted it and which run it is; the task runs from its first step again and
succeeds. The store holds the restart's transition and the audit log the accepted control.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import pytest
from playwright.async_api import async_playwright, expect

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.topics import Topic
from services.shared.registry import register
from services.store.db import migrate, open_store
from services.store.queries import get_task, list_audit
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    ApiSite,
    is_up,
    name,
    services,
    stack_env,
    tap,
)
from tests.integration.test_console import (
    MS,
    OPERATOR_TOKEN,
    Console,
    events_of,
    screenshot,
    wait_healthy,
)
from tests.integration.test_console_ml import sign_in
from tests.integration.test_operator_control import task_of
from warden import launcher

NODES = ["node-001", "node-002", "node-003"]
TARGET = "node-002"
REASON = "the offline command failed on a flaky BMC; reseated"


@pytest.mark.timeout(900)  # the waits' own deadlines, not this, are what should fail
async def test_an_operator_restarts_a_failed_task_in_the_console(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, chromium: str
) -> None:
    site = ApiSite.at(tmp_path)
    base, database_url = site.base, site.database_url
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", ANALYZER_ENABLED_NEEDS='["offline"]', COLLECTOR_PROBE_PERIOD_S="3600",
        EXECUTOR_BACKOFF_BASE_S="0.2", EXECUTOR_BACKOFF_MAX_S="0.5",
        **site.env(f"{OPERATOR_TOKEN}:olivia:operator"),
        **SMALL_POOL_SAFETY,
    )
    await migrate(database_url)  # once: the recorder and the API would race to create it
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, (*launcher.SERVICES, launcher.API)):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_TASK_EVENTS, namespace)) as watch, \
                    async_playwright() as pw:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")

                # ---- the task fails: its node's agent fails offline_node every attempt
                fleet.inject_fault(tmp_path, TARGET, fail_actions=["offline_node"])
                fleet.inject_fault(tmp_path, TARGET, xid=[79])
                await watch.wait_for(lambda _: task_of(watch, TARGET) is not None, 120,
                                     "the offline task")
                found = task_of(watch, TARGET)
                assert found is not None
                task_id: UUID = found
                await watch.wait_for(
                    lambda _: any(e.state == "failed" and e.step_state is None
                                  for e in events_of(watch, task_id)), 180, "the task to fail")
                fleet.inject_fault(tmp_path, TARGET, fail_actions=[])

                # ---- the operator restarts it from its page
                await wait_healthy(base, 120)
                console = await Console.launch(pw, chromium)
                page = await console.page()
                await sign_in(page, base, OPERATOR_TOKEN, f"task/{task_id}")
                state = page.get_by_test_id("task-state").locator(".badge")
                await expect(state).to_have_text("failed", timeout=120 * MS)
                actions = page.get_by_test_id("task-actions")
                await expect(actions.locator('button[data-action="retry"]')).to_be_visible()
                restart = actions.locator('button[data-action="restart"]')
                await expect(restart).to_be_enabled()
                await restart.click()
                await page.fill("#action-reason", REASON)
                await page.click("#action-confirm")
                await expect(page.get_by_test_id("control-accepted")).to_be_visible()

                # The page names who restarted it and the run; the task succeeds.
                restarted = page.get_by_test_id("task-restarted")
                await expect(restarted).to_contain_text("Restarted by olivia", timeout=120 * MS)
                await expect(restarted).to_contain_text("(run 1)")
                await expect(restarted).to_contain_text(REASON)
                await expect(state).to_have_text("succeeded", timeout=180 * MS)
                await expect(page.locator('[data-step="0"]')).to_have_attribute(
                    "data-state", "completed")
                await expect(page.locator('[data-step="1"]')).to_have_attribute(
                    "data-state", "completed")
                await screenshot(page, "task-restarted")
                await console.close()

                # On the bus: the operator's restart, from the failed state to the first step.
                def restart_of(_: object) -> bool:
                    return any(e.outputs.get("control") == "restart"
                               and not e.outputs.get("refused")
                               for e in events_of(watch, task_id))

                await watch.wait_for(restart_of, 60, "the restart on the bus")
                restart_event = next(e for e in events_of(watch, task_id)
                                     if e.outputs.get("control") == "restart"
                                     and not e.outputs.get("refused"))
                assert (restart_event.actor, restart_event.previous_state,
                        restart_event.step_index) == ("olivia", "failed", 0)

            store = open_store(database_url)
            try:
                async with store.session() as session:
                    task = await get_task(session, task_id)
                    audit, _ = await list_audit(session, 100, 0)
            finally:
                await store.close()
            assert task is not None
            assert task.state == "succeeded"
            assert REASON in restart_event.reason, restart_event.reason
            # The store's record of the restart is the bus's.
            assert any((t.actor, t.state, t.reason) == ("olivia", "running",
                                                        restart_event.reason)
                       for t in task.transitions), "\n".join(
                f"{t.actor} {t.state} {t.reason}" for t in task.transitions)
            restarts = [(a.actor, a.reason, a.result) for a in audit if a.action == "restart"]
            assert ("olivia", REASON, "accepted") in restarts, restarts
        finally:
            fleet.fleet_down(tmp_path)
