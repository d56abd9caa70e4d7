"""The console's ML pages in a real browser: submit a task, see its decision and the models.

Everything is real and as cheap as it gets while staying real: the router, the store's
recorder and the API (uvicorn) as processes on the real broker, Redis and PostgreSQL; two
agents serving the two models that train fastest (k nearest neighbours and a short softmax
regression, a second or so each); and Debian's Chromium driven headless by Playwright.

An operator submits a digit from the console's form (POST /api/ml/tasks); the router chooses
a model and a node and the agent answers; the page follows the task to its end and shows the
decision's candidates with the chosen one highlighted, which must be the arm the store
recorded. A second task with a malformed input (through the API) fails with `bad_input`. The
live list shows both with their models, attempts and outcomes and filters by state; the
Models page shows each version with its nodes ready and its statistics; a viewer sees the
pages but is offered no form.

CONSOLE_SCREENSHOT_DIR keeps a screenshot of each page (docs/console/ml-tasks.png is the
list).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Page, async_playwright, expect

from agent import fleet
from agent.ml.data import PIXEL_MAX, digits, split
from common.signing import ensure_signer_keys
from services.shared.registry import register
from services.store.db import migrate
from tests.integration.harness import ApiSite, services, stack_env, until
from tests.integration.test_console import (
    WAIT_MS,
    Console,
    screenshot,
    wait_healthy,
)
from warden import launcher

CLUSTER = "itest"
FLEET = {"node-001": "digits-knn@1,digits-logreg@1", "node-002": "digits-knn@1"}
OPERATOR_TOKEN = "console-ml-operator-token-0123456789"
VIEWER_TOKEN = "console-ml-viewer-token-0123456789"
MORE = 4
# Every `expect` waits up to WAIT_MS for its condition (not Playwright's 5 s): as in
# test_console, which sets the same.
expect.set_options(timeout=WAIT_MS)


async def sign_in(page: Page, base: str, token: str, route: str) -> None:
    await page.goto(f"{base}/#/{route}")
    await page.fill("#token", token)
    await page.click("#login-button")


async def dismiss_flash(page: Page) -> None:
    """Close the console's messages, so that a screenshot shows the page under them."""
    for button in await page.locator("#flash .msg button").all():
        await button.click()


async def models_ready(base: str, token: str) -> bool:
    """Every model of the fleet ready, as the router's registry (and the API) says."""
    async with httpx.AsyncClient(base_url=base, timeout=5.0,
                                 headers={"Authorization": f"Bearer {token}"}) as api:
        response = await api.get("/api/ml/models")
    if response.status_code != 200:
        return False
    ready = {(a["node_id"], f"{a['model']}@{a['version']}") for a in response.json()["arms"]
             if a["ready"]}
    return ready >= {(node, m) for node, ms in FLEET.items() for m in ms.split(",")}


@pytest.mark.timeout(900)  # the waits' own deadlines, not this, are what should fail
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_an_ml_task_and_its_decision_in_the_console(
    kafka_bootstrap: str, redis_url: str, namespace: str, database_url: str, tmp_path: Path,
    chromium: str,
) -> None:
    site = ApiSite.at(tmp_path, database_url)
    base = site.base
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_PEER_PROBES="0", AGENT_JOBS="",
        **site.env(f"{OPERATOR_TOKEN}:olivia:operator,{VIEWER_TOKEN}:vic:viewer"),
    )
    await migrate(database_url)  # once, before the store and the API both start
    trusted = ensure_signer_keys(tmp_path / "keys")
    _, _, x_test, _ = split(*digits())
    digit = [float(round(v * PIXEL_MAX)) for v in x_test[3]]
    async with services(env, tmp_path, ("router", "store", launcher.API)):
        await register(redis_url, namespace, CLUSTER, list(FLEET))
        for node, models in FLEET.items():
            fleet.start_agent(node, gpus=1, cluster_id=CLUSTER, namespace=namespace,
                              state_dir=tmp_path, env=env, trusted_keys=trusted,
                              interval_s=1.0, jobs="", models=models)
        try:
            await wait_healthy(base, 120)
            await until(lambda: models_ready(base, OPERATOR_TOKEN), 180, "every model ready")
            async with async_playwright() as pw:
                console = await Console.launch(pw, chromium)
                page = await console.page()

                # The operator submits a digit from the ML tasks page.
                await sign_in(page, base, OPERATOR_TOKEN, "ml")
                await expect(page.get_by_test_id("ml-tasks-table")).to_be_visible()
                await page.get_by_test_id("ml-submit-panel").locator("summary").click()
                await page.get_by_test_id("ml-input").fill(
                    ", ".join(f"{v:g}" for v in digit))
                await page.get_by_test_id("ml-submit").click()
                await expect(page.get_by_test_id("ml-accepted")).to_contain_text("submitted")

                # The page follows the task (it polls) to its end: the answer and the
                # decision, every candidate with the chosen one highlighted.
                await page.wait_for_url("**/#/mltask/*")
                task_id = page.url.rsplit("/", 1)[1]
                state = page.get_by_test_id("ml-task-state").locator(".badge")
                await expect(state).to_have_text("succeeded")
                async with httpx.AsyncClient(
                        base_url=base, timeout=10.0,
                        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as api:
                    record: dict[str, Any] = (await api.get(f"/api/ml/tasks/{task_id}")).json()
                    # More traffic for the list: a malformed input, and a few more digits.
                    bad = await api.post("/api/ml/tasks", json={
                        "task_type": "digits", "input": digit[:63], "deadline_s": 10.0})
                    assert bad.status_code == 202, bad.text
                    bad_id = bad.json()["task_id"]
                    for row in x_test[10:10 + MORE]:
                        more = await api.post("/api/ml/tasks", json={
                            "task_type": "digits", "priority": 3,
                            "input": [float(round(v * PIXEL_MAX)) for v in row]})
                        assert more.status_code == 202, more.text
                [attempt] = record["attempt_list"]
                chosen_arm = f"{record['model']}:{record['version']}@{record['node_id']}"
                arms = {f"{c['model']}@{c['node']}" for c in attempt["candidates"]}
                assert arms == {f"{m.replace('@', ':')}@{node}"
                                for node, ms in FLEET.items() for m in ms.split(",")}
                assert chosen_arm in arms

                attempts = page.get_by_test_id("attempt")
                await expect(attempts).to_have_count(1)
                await expect(attempts.first).to_have_attribute("data-outcome", "succeeded")
                await expect(page.get_by_test_id("attempt-chosen")).to_have_text(chosen_arm)
                rows = page.get_by_test_id("candidates").locator("tbody tr")
                await expect(rows).to_have_count(len(arms))
                chosen = page.locator('table.candidates tr[data-chosen="true"]')
                await expect(chosen).to_have_count(1)
                await expect(chosen).to_have_class(re.compile(r"\bchosen\b"))
                await expect(chosen.locator("td").first).to_contain_text(chosen_arm)
                await expect(chosen).to_contain_text("chosen")
                assert record["prediction"] in range(10)
                await expect(page.get_by_test_id("ml-task-outcome")).to_contain_text(
                    f"→ {record['prediction']}")
                await dismiss_flash(page)
                await screenshot(page, "ml-task")

                # The live list: both tasks, with where they ran and how they ended.
                await page.click('#nav a[data-route="ml"]')
                done = page.locator(f'tr[data-task-id="{task_id}"]')
                await expect(done).to_have_attribute("data-state", "succeeded")
                await expect(done.get_by_test_id("ml-arm")).to_contain_text(chosen_arm)
                await expect(done.locator("td").nth(3)).to_have_text("1")
                failed = page.locator(f'tr[data-task-id="{bad_id}"]')
                await expect(failed).to_have_attribute("data-state", "failed")
                await expect(failed.get_by_test_id("ml-outcome")).to_have_text("bad input")
                await page.select_option('select[name="state"]', "failed")
                await expect(done).to_have_count(0)
                await expect(failed).to_be_visible()
                await page.select_option('select[name="state"]', "")
                await expect(done).to_be_visible()
                await expect(page.locator('tr[data-state="succeeded"]')).to_have_count(
                    1 + MORE)
                await dismiss_flash(page)
                await screenshot(page, "ml-tasks")

                # Models: each version with its nodes ready and its live statistics.
                await page.click('#nav a[data-route="models"]')
                knn = page.locator('tr.version[data-model="digits-knn"][data-version="1"]')
                await expect(knn.get_by_test_id("nodes-ready")).to_have_text(
                    "2 of 2 nodes ready")
                logreg = page.locator('tr.version[data-model="digits-logreg"]')
                await expect(logreg.get_by_test_id("nodes-ready")).to_have_text(
                    "1 of 1 node ready")
                arm_row = page.locator(f'tr.arm[data-arm="{chosen_arm}"]')
                await expect(arm_row).to_have_attribute("data-ready", "true")
                n_eff = float(await arm_row.locator("td.num").first.inner_text())
                assert n_eff > 0.5, n_eff  # the success counted (decaying since)
                await screenshot(page, "models")

                # A viewer sees the task and its decision, and is offered no form.
                viewer = await console.page()
                await sign_in(viewer, base, VIEWER_TOKEN, f"mltask/{task_id}")
                await expect(viewer.get_by_test_id("ml-task-state").locator(".badge")
                             ).to_have_text("succeeded")
                await expect(viewer.locator('table.candidates tr[data-chosen="true"]')
                             ).to_have_count(1)
                await viewer.click('#nav a[data-route="ml"]')
                await expect(viewer.locator(f'tr[data-task-id="{task_id}"]')).to_be_visible()
                await expect(viewer.get_by_test_id("ml-submit-panel")).to_have_count(0)
                await console.close()
        finally:
            fleet.fleet_down(tmp_path)
