"""`warden api token`: the entries it prints are ones the API accepts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from typer.testing import CliRunner

from schemas.events.v1 import now_utc
from services.api.auth import Principal, Refusal, load_tokens
from warden.cli import app


def test_api_token_prints_an_entry_the_api_accepts() -> None:
    result = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role",
                                      "operator"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    token = lines[0].removeprefix("token: ")
    plain, hashed = lines[2].strip(), lines[4].strip()
    for entry in (plain, hashed):
        principal = load_tokens(entry).authenticate(token, now_utc())
        assert isinstance(principal, Principal)
        assert (principal.user, principal.role) == ("erin", "operator")
    bad = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role", "root"])
    assert bad.exit_code == 2


def test_api_token_with_a_ttl_makes_an_entry_that_expires() -> None:
    before = now_utc().replace(microsecond=0)
    result = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role", "viewer",
                                      "--ttl", "12h"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    token = lines[0].removeprefix("token: ")
    [entry] = load_tokens(lines[2].strip()).entries
    assert entry.issued_at is not None
    assert entry.expires_at is not None
    assert before <= entry.issued_at <= now_utc()
    assert entry.expires_at - entry.issued_at == timedelta(hours=12)
    assert lines[-1] == f"it expires at {entry.expires_at.isoformat()}"
    table = load_tokens(lines[4].strip())
    assert isinstance(table.authenticate(token, entry.issued_at), Principal)
    assert table.authenticate(token, entry.expires_at) == Refusal("token_expired")


@pytest.mark.parametrize("ttl", ["0h", "12", "1w", "-3d", "1.5h"])
def test_api_token_refuses_a_ttl_it_cannot_read(ttl: str) -> None:
    bad = CliRunner().invoke(app, ["api", "token", "--user", "erin", "--role", "viewer",
                                   "--ttl", ttl])
    assert bad.exit_code == 2
