"""`warden api token`, the task description `warden tasks show` prints, and the API's local
environment `warden up` makes (pure; the commands against the API are in
tests/service/api/test_cli_api.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from services.api.auth import load_tokens
from services.shared.settings import ServiceSettings
from warden.cli import app, common, local, tasks


def test_api_token_prints_an_entry_the_api_accepts() -> None:
    result = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role",
                                      "operator"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    token = lines[0].removeprefix("token: ")
    plain, hashed = lines[2].strip(), lines[4].strip()
    for entry in (plain, hashed):
        principal = load_tokens(entry).authenticate(token)
        assert principal is not None
        assert (principal.user, principal.role) == ("erin", "operator")
    bad = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role", "root"])
    assert bad.exit_code == 2


def test_describe_task_shows_initial_and_target_resources() -> None:
    step: dict[str, Any] = {
        "index": 0, "name": "add-capacity", "action": "add_capacity", "guard": None,
        "state": "completed", "attempts": 1, "command_id": None, "reason": "",
        "outputs": {"initial_nodes": 3, "initial_util_pct": 90.0, "target_nodes": 4,
                    "target_util_pct": 67.5}}
    text = tasks.describe_task({"task_id": "t", "state": "succeeded", "cluster_id": "c1",
                              "steps": [step]})
    assert "3 nodes at 90% -> 4 nodes at 67.5%" in text


def test_up_makes_a_local_admin_token_and_points_the_templater_at_the_api_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("API_TOKENS", "API_TOKENS_FILE", "TEMPLATER_TEMPLATE_DIR", "WARDEN_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    env = local.api_env(ServiceSettings())
    tokens = Path(env["API_TOKENS_FILE"])
    assert tokens.stat().st_mode & 0o777 == 0o600
    [entry] = load_tokens("", str(tokens)).entries
    assert (entry.principal.user, entry.principal.role) == ("local-admin", "admin")
    assert Path(env["TEMPLATER_TEMPLATE_DIR"]) == tmp_path / "templates"
    assert (tmp_path / "templates" / "offline.yaml").exists()
    content = tokens.read_text()
    assert local.api_env(ServiceSettings())["API_TOKENS_FILE"] == str(tokens)
    assert tokens.read_text() == content  # made once
    # The CLI uses that token when WARDEN_API_TOKEN is not set.
    token = content.splitlines()[1].partition(":")[0]
    with common.api_client() as client:
        assert client.http.headers["Authorization"] == f"Bearer {token}"
    monkeypatch.setenv("API_TOKENS", "x")
    assert "API_TOKENS_FILE" not in local.api_env(ServiceSettings())
