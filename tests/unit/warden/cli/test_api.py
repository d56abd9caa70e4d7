"""`warden api token`: the entries it prints are ones the API accepts."""

from __future__ import annotations

from typer.testing import CliRunner

from services.api.auth import load_tokens
from warden.cli import app


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
