"""Token configuration and the role order (pure: no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.api.auth import (
    ROLES,
    Principal,
    TokenConfigError,
    digest,
    load_tokens,
    new_token,
    token_lines,
)

TOKEN = "s3cret-token-0123456789"


def test_roles_are_ordered_viewer_operator_admin() -> None:
    allowed = {
        (who, needed): Principal("u", who).allows(needed)
        for who in ROLES for needed in ROLES
    }
    assert allowed == {
        ("viewer", "viewer"): True, ("viewer", "operator"): False, ("viewer", "admin"): False,
        ("operator", "viewer"): True, ("operator", "operator"): True,
        ("operator", "admin"): False,
        ("admin", "viewer"): True, ("admin", "operator"): True, ("admin", "admin"): True,
    }


def test_tokens_are_kept_as_digests_and_found_by_the_token() -> None:
    table = load_tokens(f"{TOKEN}:alice:operator, other-token-01234567:bob:viewer")
    assert len(table) == 2
    assert all(TOKEN.encode() not in e.digest for e in table.entries)
    assert table.authenticate(TOKEN) == Principal("alice", "operator")
    assert table.authenticate("other-token-01234567") == Principal("bob", "viewer")
    assert table.authenticate(TOKEN + "x") is None
    assert table.authenticate("") is None


def test_a_digest_entry_grants_the_token_it_hashes(tmp_path: Path) -> None:
    plain, hashed = token_lines(TOKEN, "carol", "admin")
    assert plain == f"{TOKEN}:carol:admin"
    assert TOKEN not in hashed
    path = tmp_path / "tokens"
    path.write_text(f"# admins\n\n{hashed}\n")
    assert load_tokens("", str(path)).authenticate(TOKEN) == Principal("carol", "admin")


@pytest.mark.parametrize(("entry", "message"), [
    ("no-separators-at-all", "expected <token>:<user>:<role>"),
    (f"{TOKEN}:alice", "expected <token>:<user>:<role>"),
    (f"{TOKEN}:alice:root", "role 'root'"),
    (f"{TOKEN}:al ice:viewer", "user 'al ice'"),
    ("short:alice:viewer", "shorter than 16"),
    ("sha256=abc:alice:viewer", "64 hex digits"),
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
    assert load_tokens(token_lines(first, "dave", "viewer")[0]).authenticate(first)
