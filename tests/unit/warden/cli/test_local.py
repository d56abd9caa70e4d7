"""The API's local environment `warden up` makes: a local admin token, which the commands use
when WARDEN_API_TOKEN is not set; templates come from the shared task store (pure; the commands
against the API are in tests/service/warden/cli/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.settings import ServiceSettings
from services.api.auth import load_tokens
from warden.cli import common, local


def test_up_makes_a_local_admin_token_and_leaves_templates_to_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("API_TOKENS", "API_TOKENS_FILE", "TEMPLATER_TEMPLATE_DIR", "WARDEN_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    env = local.api_env(ServiceSettings())
    tokens = Path(env["API_TOKENS_FILE"])
    assert tokens.stat().st_mode & 0o777 == 0o600
    [entry] = load_tokens("", str(tokens)).entries
    assert (entry.principal.user, entry.principal.role) == ("local-admin", "admin")
    # No folder to point the templater at: the API and the templater share the store.
    assert "TEMPLATER_TEMPLATE_DIR" not in env
    content = tokens.read_text()
    assert local.api_env(ServiceSettings())["API_TOKENS_FILE"] == str(tokens)
    assert tokens.read_text() == content  # made once
    # The CLI uses that token when WARDEN_API_TOKEN is not set.
    token = content.splitlines()[1].partition(":")[0]
    with common.api_client() as client:
        assert client.http.headers["Authorization"] == f"Bearer {token}"
    monkeypatch.setenv("API_TOKENS", "x")
    assert "API_TOKENS_FILE" not in local.api_env(ServiceSettings())
