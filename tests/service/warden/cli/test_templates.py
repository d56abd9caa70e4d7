"""`warden templates` against the real API (in process) and its task store."""

from __future__ import annotations

from pathlib import Path

from services.templater.templates import TEMPLATE_DIR
from tests.service.warden.cli.conftest import Cli


def test_templates_list_show_validate_and_save(warden: Cli, tmp_path: Path) -> None:
    listed = warden.run("templates", "list", role="viewer")
    assert listed.exit_code == 0
    assert "load_balance" in listed.output
    shown = warden.run("templates", "show", "offline")
    assert "name: offline" in shown.output

    good = tmp_path / "load_balance.yaml"
    good.write_text((TEMPLATE_DIR / "load_balance.yaml").read_text()
                    .replace("version: 1", "version: 2"))
    result = warden.run("templates", "validate", str(good), role="operator")
    assert result.exit_code == 0, result.output
    assert "valid (load_balance.v2 for need load_balance, 2 steps)" in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("jobs_per_run: 1", "jobs_per_run: 0"))
    result = warden.run("templates", "validate", str(bad))
    assert result.exit_code == 1
    assert "steps.0.args.max_jobs: Input should be greater than or equal to 1" in result.output

    # Only the version line differs from the active version: nothing to save.
    assert "unchanged" in warden.run("templates", "save", str(good), "--reason", "v2",
                                     role="admin").output
    good.write_text(good.read_text().replace("jobs_per_run: 1", "jobs_per_run: 2"))
    assert warden.run("templates", "save", str(good), "--reason", "v2",
                      role="operator").exit_code == 1
    result = warden.run("templates", "save", str(good), "--reason", "v2", role="admin")
    assert result.exit_code == 0, result.output
    assert "load_balance.yaml: saved" in result.output
    assert "saved as load_balance.v2" in result.output


def test_templates_history_diff_rollback_pin_and_unpin(warden: Cli, tmp_path: Path) -> None:
    edited = tmp_path / "load_balance.yaml"
    edited.write_text((TEMPLATE_DIR / "load_balance.yaml").read_text()
                      .replace("jobs_per_run: 1", "jobs_per_run: 2"))
    assert warden.run("templates", "save", str(edited), "--reason", "two",
                      role="admin").exit_code == 0

    history = warden.run("templates", "history", "load_balance", role="viewer")
    assert history.exit_code == 0, history.output
    assert "load_balance: active v2, not pinned" in history.output
    assert "v2 *" in history.output
    assert "manual" in history.output
    assert "builtin" in history.output

    diff = warden.run("templates", "diff", "load_balance", "1", "2", role="viewer")
    assert diff.exit_code == 0, diff.output
    assert "--- load_balance.v1" in diff.output
    assert "+  jobs_per_run: 2" in diff.output

    assert warden.run("templates", "rollback", "load_balance", "1", "--reason", "too many",
                      role="operator").exit_code == 1
    rolled = warden.run("templates", "rollback", "load_balance", "1", "--reason", "too many",
                        role="admin")
    assert rolled.exit_code == 0, rolled.output
    assert "version 1 is active again as load_balance.v3" in rolled.output
    same = warden.run("templates", "diff", "load_balance", "1", "3", role="viewer")
    assert "-version: 1" in same.output
    assert "jobs_per_run" not in same.output

    pinned = warden.run("templates", "pin", "load_balance", "--reason", "audit week",
                        role="operator")
    assert pinned.exit_code == 0, pinned.output
    assert "pinned at v3" in pinned.output
    assert "pinned by" in warden.run("templates", "history", "load_balance").output
    assert "yes (" in warden.run("templates", "list").output
    unpinned = warden.run("templates", "unpin", "load_balance", role="operator")
    assert unpinned.exit_code == 0, unpinned.output
    assert "unpinned (v3)" in unpinned.output
