"""The console's Alerts page in a real browser: an operator acknowledges a firing alert.

The API runs as a process (uvicorn) on a SQLite store file, the alerts recorded in that store
from Alert events through the alerts service's own records, and Debian's Chromium is driven
headless by Playwright. The page lists the alerts firing first, the nav counts the firing
ones, the status filter narrows the list; the operator acknowledges the breaker's alert with
a reason, and the store then says who acknowledged it and why (and the audit log holds it). A
viewer sees the alerts but is offered no acknowledgement.

CONSOLE_SCREENSHOT_DIR keeps a screenshot of the page (docs/console/alerts.png).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, async_playwright, expect

from services.alerts.records import list_alerts
from services.store.db import migrate, open_store
from services.store.queries import list_audit
from tests.integration.harness import ApiSite, services, stack_env
from tests.integration.test_console import WAIT_MS, Console, screenshot, wait_healthy
from tests.integration.test_console_ml import dismiss_flash, sign_in
from tests.service.api.alert_stories import BREAKER, RESOLVED, SHORT_CIRCUIT, record, story
from warden import launcher

OPERATOR_TOKEN = "console-alerts-operator-token-0123456789"
VIEWER_TOKEN = "console-alerts-viewer-token-0123456789"
REASON = "on it: node-7's NFS mount"
# Every `expect` waits up to WAIT_MS for its condition, as in test_console.
expect.set_options(timeout=WAIT_MS)


def alert_row(page: Page, alert: tuple[str, str]) -> Locator:
    """The alert's row on the Alerts page."""
    return page.locator(f'tr[data-alert="{alert[0]}/{alert[1]}"]')


async def operator_acknowledges(page: Page, base: str) -> None:
    await sign_in(page, base, OPERATOR_TOKEN, "alerts")
    rows = page.get_by_test_id("alerts-table").locator("tbody tr")
    await expect(rows).to_have_count(3)
    # Firing first.
    for index, alert in enumerate((BREAKER, SHORT_CIRCUIT, RESOLVED)):
        await expect(rows.nth(index)).to_have_attribute("data-alert", "/".join(alert))
    await expect(page.locator("#alerts-count")).to_have_text("2")
    breaker = alert_row(page, BREAKER)
    await expect(breaker).to_contain_text("4 failed offline adjustments in the window")
    await expect(breaker.locator("td.num")).to_have_text("2")
    await expect(breaker.locator(".badge.critical")).to_be_visible()
    resolved = alert_row(page, RESOLVED)
    await expect(resolved).to_contain_text("breaker c2/migrate reset by ada: NFS fixed")
    await expect(resolved.locator('button[data-action="ack"]')).to_have_count(0)

    await breaker.locator('button[data-action="ack"]').click()
    await page.fill("#action-reason", REASON)
    await page.click("#action-confirm")
    await expect(page.get_by_test_id("alert-acknowledged")).to_contain_text(
        "acknowledged by olivia")
    await expect(breaker).to_have_attribute("data-acknowledged", "true")
    await expect(breaker.get_by_test_id("alert-ack")).to_contain_text("olivia")
    await expect(breaker.get_by_test_id("alert-ack")).to_contain_text(REASON)
    await expect(breaker.locator('button[data-action="ack"]')).to_have_count(0)
    # Still two firing; the short-circuit's alert is still unacknowledged.
    await expect(page.locator("#alerts-count")).to_have_text("2")
    unacknowledged = page.locator('tr[data-status="firing"][data-acknowledged="false"]')
    await expect(unacknowledged).to_have_count(1)
    await dismiss_flash(page)
    await screenshot(page, "alerts")

    await page.select_option('select[name="status"]', "resolved")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-alert", "/".join(RESOLVED))
    await page.select_option('select[name="status"]', "firing")
    await expect(rows).to_have_count(2)


async def viewer_may_not_acknowledge(page: Page, base: str) -> None:
    await sign_in(page, base, VIEWER_TOKEN, "alerts?status=firing")
    short_circuit = alert_row(page, SHORT_CIRCUIT)
    button = short_circuit.locator('button[data-action="ack"]')
    await expect(button).to_be_disabled()
    assert "operator" in (await button.get_attribute("title") or "")
    await expect(alert_row(page, BREAKER)
                 .get_by_test_id("alert-ack")).to_contain_text("olivia")


@pytest.mark.timeout(600)  # the waits' own deadlines, not this, are what should fail
async def test_an_operator_acknowledges_an_alert_in_the_console(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, chromium: str
) -> None:
    site = ApiSite.at(tmp_path)
    base, database_url = site.base, site.database_url
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        **site.env(f"{OPERATOR_TOKEN}:olivia:operator,{VIEWER_TOKEN}:vic:viewer"),
    )
    await migrate(database_url)
    store = open_store(database_url)
    try:
        await record(store, story())
        async with services(env, tmp_path, (launcher.API,)), async_playwright() as pw:
            await wait_healthy(base, 120)
            console = await Console.launch(pw, chromium)
            await operator_acknowledges(await console.page(), base)
            await viewer_may_not_acknowledge(await console.page(), base)
            await console.close()

        async with store.session() as session:
            alerts, _ = await list_alerts(session, None, None, 500, 0)
            audit, _ = await list_audit(session, 100, 0)
    finally:
        await store.close()
    by_key = {(a.cluster_id, a.dedup_key): a for a in alerts}
    acked = by_key[BREAKER]
    assert (acked.status, acked.acknowledged_by, acked.ack_reason) == ("firing", "olivia", REASON)
    assert acked.acknowledged_at is not None
    assert by_key[SHORT_CIRCUIT].acknowledged_by is None
    assert [(a.actor, a.action, a.target, a.reason, a.result) for a in audit
            if a.action == "alert_ack"] == [
        ("olivia", "alert_ack", f"alert/{BREAKER[0]}/{BREAKER[1]}", REASON, "acknowledged")]
