"""`warden templates` against the real API (in process) and its template folder."""

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

    assert warden.run("templates", "save", str(good), "--reason", "v2",
                      role="operator").exit_code == 1
    result = warden.run("templates", "save", str(good), "--reason", "v2", role="admin")
    assert result.exit_code == 0, result.output
    assert "load_balance.yaml: saved" in result.output
