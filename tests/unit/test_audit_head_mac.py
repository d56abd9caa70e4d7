"""The audit chains' keyed head (pure): the MAC names its domain, its log, the hash and the
count, so no other head, log or key gives it; a head without one fails unless it is a new
log's; and where the key comes from (the setting, else a file made once in the state folder).
The chains on the real redis-server and databases: tests/service/scheduler/test_audit_head_key.py
and tests/unit/store/test_audit_head_key.py."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from common.settings import ServiceSettings
from services.shared.audit import (
    FORGED,
    GENESIS,
    UNKEYED,
    audit_key,
    audit_key_path,
    ensure_audit_key_file,
    head_fault,
    head_mac,
)

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
HASH = "ab" * 32
CHAIN = "ns:audit"


def test_the_mac_is_an_hmac_of_the_domain_the_log_and_the_head() -> None:
    expected = hmac.new(KEY, b"clusterwarden-audit-head-v1\0ns:audit\0" + f"{HASH}:3".encode(),
                        hashlib.sha256).hexdigest()
    assert head_mac(KEY, CHAIN, HASH, 3) == expected
    # Not the bare "<hash>:<count>": the key's MACs for anything else cannot pass for a head.
    assert expected != hmac.new(KEY, f"{HASH}:3".encode(), hashlib.sha256).hexdigest()


def test_every_part_of_the_head_changes_the_mac() -> None:
    mac = head_mac(KEY, CHAIN, HASH, 3)
    assert len({mac, head_mac(OTHER_KEY, CHAIN, HASH, 3), head_mac(KEY, "store:audit", HASH, 3),
                head_mac(KEY, CHAIN, "cd" * 32, 3), head_mac(KEY, CHAIN, HASH, 2)}) == 5


def test_a_head_keyed_by_the_key_holds() -> None:
    assert head_fault(KEY, CHAIN, HASH, 3, head_mac(KEY, CHAIN, HASH, 3)) == ""


@pytest.mark.parametrize(("head_hash", "count", "mac"), [
    (HASH, 2, head_mac(KEY, CHAIN, HASH, 3)),  # the count rewritten
    ("cd" * 32, 3, head_mac(KEY, CHAIN, HASH, 3)),  # the hash rewritten (a cut tail)
    (HASH, 3, head_mac(OTHER_KEY, CHAIN, HASH, 3)),  # keyed with another key
    (HASH, 3, head_mac(KEY, "store:audit", HASH, 3)),  # another log's head
    (HASH, 3, "é" * 64),  # not even hex
    (GENESIS, 0, "0" * 64),  # a new log's head with a made-up MAC
])
def test_a_rewritten_or_foreign_head_fails(head_hash: str, count: int, mac: str) -> None:
    assert head_fault(KEY, CHAIN, head_hash, count, mac) == FORGED
    assert FORGED.startswith("log cut or head rewritten")


@pytest.mark.parametrize("mac", [None, ""])
def test_a_head_without_a_mac_fails_unless_the_log_is_new(mac: str | None) -> None:
    assert head_fault(KEY, CHAIN, HASH, 3, mac) == UNKEYED
    assert UNKEYED.startswith("head is not keyed by the audit key")
    assert head_fault(KEY, CHAIN, GENESIS, 0, mac) == ""


def test_the_key_file_is_made_once_owner_only(tmp_path: Path) -> None:
    path = audit_key_path(tmp_path / "state")
    assert path == tmp_path / "state" / "keys" / "audit.key"
    key = ensure_audit_key_file(path)
    assert len(key) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_audit_key_file(path) == key
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    assert ensure_audit_key_file(audit_key_path(tmp_path / "elsewhere")) != key


def test_a_short_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.key"
    path.write_text("too short\n")
    with pytest.raises(ValueError, match="at least 32"):
        ensure_audit_key_file(path)


def test_the_setting_wins_over_the_state_folder(tmp_path: Path) -> None:
    configured = "s" * 40
    settings = ServiceSettings(audit_key=SecretStr(configured), state_dir=str(tmp_path))
    assert audit_key(settings) == configured.encode()
    assert not audit_key_path(tmp_path).exists()
    from_folder = audit_key(ServiceSettings(state_dir=str(tmp_path)))
    assert from_folder == audit_key_path(tmp_path).read_text().strip().encode()


def test_the_environment_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("WARDEN_AUDIT_KEY", raising=False)
    assert audit_key(ServiceSettings()) == ensure_audit_key_file(audit_key_path(tmp_path))
    monkeypatch.setenv("WARDEN_AUDIT_KEY", "e" * 32)
    assert audit_key(ServiceSettings()) == b"e" * 32


def test_the_processs_key_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    first = audit_key()
    monkeypatch.setenv("WARDEN_AUDIT_KEY", "f" * 32)
    assert audit_key() == first  # every append and verification of a process: one key


def test_a_short_key_setting_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="WARDEN_AUDIT_KEY must be at least 32"):
        ServiceSettings(audit_key=SecretStr("short"))
    secret = "x" * 32
    assert secret not in repr(ServiceSettings(audit_key=SecretStr(secret)))  # never printed
