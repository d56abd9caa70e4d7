"""Token configuration and the role order (pure: no server)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.api.auth import (
    ROLES,
    Principal,
    Refusal,
    TokenConfigError,
    bearer_token,
    digest,
    load_tokens,
    new_token,
    token_lines,
)

TOKEN = "s3cret-token-0123456789"
NOW = datetime(2026, 12, 2, 13, 56, tzinfo=UTC)


def test_roles_are_ordered_node_viewer_operator_admin() -> None:
    allowed = {
        (who, needed): Principal("u", who).allows(needed)
        for who in ROLES for needed in ROLES
    }
    assert allowed == {
        # A bootstrap token passes only what needs no more than `node`: enrolment.
        ("node", "node"): True, ("node", "viewer"): False, ("node", "operator"): False,
        ("node", "admin"): False,
        ("viewer", "node"): True, ("operator", "node"): True, ("admin", "node"): True,
        ("viewer", "viewer"): True, ("viewer", "operator"): False, ("viewer", "admin"): False,
        ("operator", "viewer"): True, ("operator", "operator"): True,
        ("operator", "admin"): False,
        ("admin", "viewer"): True, ("admin", "operator"): True, ("admin", "admin"): True,
    }


def test_tokens_are_kept_as_digests_and_found_by_the_token() -> None:
    table = load_tokens(f"{TOKEN}:alice:operator, other-token-01234567:bob:viewer")
    assert len(table) == 2
    assert all(TOKEN.encode() not in e.digest for e in table.entries)
    assert table.authenticate(TOKEN, NOW) == Principal("alice", "operator")
    assert table.authenticate("other-token-01234567", NOW) == Principal("bob", "viewer")
    assert table.authenticate(TOKEN + "x", NOW) == Refusal("unknown_token")
    assert table.authenticate("", NOW) == Refusal("unknown_token")
    assert table.authenticate(None, NOW) == Refusal("no_token")


def test_a_digest_entry_grants_the_token_it_hashes(tmp_path: Path) -> None:
    plain, hashed = token_lines(TOKEN, "carol", "admin")
    assert plain == f"{TOKEN}:carol:admin"
    assert TOKEN not in hashed
    path = tmp_path / "tokens"
    path.write_text(f"# admins\n\n{hashed}\n")
    assert load_tokens("", str(path)).authenticate(TOKEN, NOW) == Principal("carol", "admin")


@pytest.mark.parametrize(("entry", "message"), [
    ("no-separators-at-all", "expected <token>:<user>:<role>"),
    (f"{TOKEN}:alice", "expected <token>:<user>:<role>"),
    (f"{TOKEN}:alice:root", "role 'root'"),
    (f"{TOKEN}:al ice:viewer", "user 'al ice'"),
    ("short:alice:viewer", "shorter than 16"),
    ("sha256=abc:alice:viewer", "64 hex digits"),
    (f"{TOKEN}:alice:viewer:expires=2026-12-02T13:56:00Z", "a UTC time like 20261202T135600Z"),
    (f"{TOKEN}:alice:viewer:expires=tomorrow", "a UTC time like"),
    (f"{TOKEN}:alice:viewer:expires=20261302T000000Z", "is not a date"),
    (f"{TOKEN}:alice:viewer:ttl=20261202T000000Z", "issued=<time> and expires=<time>"),
    (f"{TOKEN}:alice:viewer:expires=20261202T000000Z:expires=20261203T000000Z", "each once"),
    (f"{TOKEN}:alice:viewer:issued=20261203T000000Z:expires=20261202T000000Z",
     "must come after issued="),
])
def test_a_malformed_entry_is_named_without_its_token(entry: str, message: str) -> None:
    with pytest.raises(TokenConfigError, match="API_TOKENS entry 1") as caught:
        load_tokens(entry)
    assert message in str(caught.value)
    assert TOKEN not in str(caught.value)


def test_one_token_for_two_users_is_refused() -> None:
    with pytest.raises(TokenConfigError, match="configured twice"):
        load_tokens(f"{TOKEN}:alice:viewer,sha256={digest(TOKEN).hex()}:bob:admin")


def test_a_file_entry_error_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"{TOKEN}:alice:viewer\nbroken\n")
    with pytest.raises(TokenConfigError, match="line 2"):
        load_tokens("", str(path))


def test_new_tokens_are_long_random_and_usable() -> None:
    first, second = new_token(), new_token()
    assert first != second
    assert len(first) >= 40
    assert ":" not in first
    assert isinstance(load_tokens(token_lines(first, "dave", "viewer")[0])
                      .authenticate(first, NOW), Principal)


def test_a_token_is_refused_as_expired_from_its_expiry_on() -> None:
    table = load_tokens(f"{TOKEN}:alice:admin:issued=20261202T120000Z:expires=20261202T130000Z")
    [entry] = table.entries
    assert entry.issued_at == datetime(2026, 12, 2, 12, tzinfo=UTC)
    assert entry.expires_at == datetime(2026, 12, 2, 13, tzinfo=UTC)
    before = datetime(2026, 12, 2, 12, 59, 59, tzinfo=UTC)
    assert table.authenticate(TOKEN, before) == Principal("alice", "admin")
    assert table.authenticate(TOKEN, entry.expires_at) == Refusal("token_expired")
    assert table.authenticate(TOKEN, NOW) == Refusal("token_expired")
    # Expired or not, a wrong token is only unknown: the expiry tells a guesser nothing.
    assert table.authenticate(TOKEN + "x", NOW) == Refusal("unknown_token")


def test_an_entry_without_an_expiry_never_expires() -> None:
    table = load_tokens(f"{TOKEN}:alice:admin:issued=20261202T120000Z")
    far = NOW + timedelta(days=3650)
    assert table.authenticate(TOKEN, far) == Principal("alice", "admin")


def test_a_token_made_with_a_ttl_expires_that_long_after_it_was_issued() -> None:
    plain, hashed = token_lines(TOKEN, "erin", "operator", issued_at=NOW,
                                ttl=timedelta(hours=12))
    assert plain == (f"{TOKEN}:erin:operator:issued=20261202T135600Z"
                     ":expires=20261203T015600Z")
    assert hashed.endswith(":erin:operator:issued=20261202T135600Z:expires=20261203T015600Z")
    for entry in (plain, hashed):
        table = load_tokens(entry)
        assert table.authenticate(TOKEN, NOW + timedelta(hours=11, minutes=59)) == \
            Principal("erin", "operator")
        assert table.authenticate(TOKEN, NOW + timedelta(hours=12)) == Refusal("token_expired")
    with pytest.raises(ValueError, match="issued at"):
        token_lines(TOKEN, "erin", "operator", ttl=timedelta(hours=1))


@pytest.mark.parametrize(("header", "token"), [
    (None, None), ("", None), ("Bearer", None), ("Bearer   ", None),
    (f"Basic {TOKEN}", None), (f"Bearer {TOKEN}", TOKEN), (f"bearer  {TOKEN} ", TOKEN),
])
def test_the_bearer_token_of_an_authorization_header(header: str | None,
                                                     token: str | None) -> None:
    assert bearer_token(header) == token
