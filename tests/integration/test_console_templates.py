"""The console's template page in a real browser: an admin reads a template's history and a
diff, pins it and rolls it back; a viewer sees the same page with its buttons disabled.

The API runs as a process on a SQLite store file in which load_balance already has an
operator's second version; Debian's Chromium is driven headless by Playwright. After the
clicks, the store holds the rollback as a third version equal to the first and the pin, and
the audit log holds both.

CONSOLE_SCREENSHOT_DIR keeps a screenshot of the page (docs/console/template.png).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Page, async_playwright, expect

from schemas.events.v1 import TemplateChanged
from services.store.db import migrate, open_store
from services.store.queries import list_audit
from services.store.template_seed import seed_templates
from services.store.template_versions import SaveRequest, TemplateBook, history, state_of
from services.templater.templates import TEMPLATE_DIR
from tests.integration.harness import ApiSite, services, stack_env
from tests.integration.test_console import (
    WAIT_MS,
    Console,
    screenshot,
    wait_healthy,
)
from tests.integration.test_console_ml import sign_in
from warden import launcher

ADMIN_TOKEN = "console-templates-admin-token-0123456789"
VIEWER_TOKEN = "console-templates-viewer-token-0123456789"
LB = (TEMPLATE_DIR / "load_balance.yaml").read_text()
expect.set_options(timeout=WAIT_MS)


async def nobody(_: TemplateChanged) -> None:
    return None


async def admin_pins_and_rolls_back(page: Page, base: str) -> None:
    await sign_in(page, base, ADMIN_TOKEN, "templates")
    row = page.locator('tr[data-template="load_balance"]')
    await expect(row).to_contain_text("v2")
    await expect(row).to_contain_text("manual")
    await row.locator("a").click()
    versions = page.get_by_test_id("template-history").locator("tbody tr")
    await expect(versions).to_have_count(2)
    await expect(versions.first).to_contain_text("two jobs per run")

    await page.click('button[data-action="diff"]')
    diff = page.get_by_test_id("template-diff")
    await expect(diff.locator("span.add")).to_contain_text(["+version: 2", "+  jobs_per_run: 2"])
    await expect(diff.locator("span.del")).to_contain_text(["-version: 1", "-  jobs_per_run: 1"])

    await page.click('button[data-action="pin"]')
    await page.fill("#action-reason", "audit week")
    await page.click("#action-confirm")
    await expect(page.get_by_test_id("template-pinned")).to_contain_text("load_balance pinned")
    await expect(page.locator('[data-pinned="true"]')).to_contain_text("audit week")

    await page.locator('tr[data-version="1"] button[data-action="rollback"]').click()
    await page.fill("#action-reason", "two moved too much")
    await page.click("#action-confirm")
    await expect(page.get_by_test_id("template-rolled-back")).to_contain_text(
        "version 1 is active again as load_balance.v3")
    await expect(versions).to_have_count(3)
    await expect(page.locator('tr[data-version="3"]')).to_contain_text("rollback")
    await expect(page.get_by_test_id("template-yaml")).to_contain_text("jobs_per_run: 1")
    # The messages may expire on their own while being dismissed one by one: clear them.
    await page.evaluate("document.getElementById('flash').replaceChildren()")
    await screenshot(page, "template")


async def viewer_may_only_read(page: Page, base: str) -> None:
    await sign_in(page, base, VIEWER_TOKEN, "template/load_balance")
    await expect(page.get_by_test_id("template-history").locator("tbody tr")).to_have_count(3)
    await expect(page.locator('button[data-action="unpin"]')).to_be_disabled()
    rollback = page.locator('tr[data-version="2"] button[data-action="rollback"]')
    await expect(rollback).to_be_disabled()
    assert "admin" in (await rollback.get_attribute("title") or "")


@pytest.mark.timeout(600)  # the waits' own deadlines, not this, are what should fail
async def test_an_admin_pins_and_rolls_back_a_template_in_the_console(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path, chromium: str
) -> None:
    site = ApiSite.at(tmp_path)
    base, database_url = site.base, site.database_url
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    **site.env(f"{ADMIN_TOKEN}:ada:admin,{VIEWER_TOKEN}:vic:viewer"))
    await migrate(database_url)
    store = open_store(database_url)
    try:
        book = TemplateBook(store, nobody)
        await seed_templates(book, TEMPLATE_DIR)
        await book.save(SaveRequest(
            name="load_balance", text=LB.replace("jobs_per_run: 1", "jobs_per_run: 2"),
            origin="manual", actor="ada", role="admin", reason="two jobs per run"))
        async with services(env, tmp_path, (launcher.API,)):
            await wait_healthy(base, 120)
            async with async_playwright() as pw:
                console = await Console.launch(pw, chromium)
                await admin_pins_and_rolls_back(await console.page(), base)
                await viewer_may_only_read(await console.page(), base)
                await console.close()
        async with store.session() as session:
            versions = await history(session, "load_balance")
            state = await state_of(session, "load_balance")
            audit, _ = await list_audit(session, 100, 0)
    finally:
        await store.close()
    assert [(v.version, v.origin) for v in versions] == [(3, "rollback"), (2, "manual"),
                                                         (1, "builtin")]
    assert versions[0].yaml == LB.replace("version: 1", "version: 3")
    assert state is not None
    assert (state.pinned, state.pinned_by, state.pin_reason) == (True, "ada", "audit week")
    assert [(a.actor, a.action, a.reason) for a in reversed(audit)
            if a.action in ("template_pin", "template_rollback")] == [
        ("ada", "template_pin", "audit week"), ("ada", "template_rollback", "two moved too much")]
