"""Who may sign what (common/signing.py): the signer roles and their actions, the key
registry an agent trusts, key files named for their role, and the trust files read again
when they change (a rotation, a revocation)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import get_args

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.signing import (
    SIGNER_ACTIONS,
    SIGNER_ROLES,
    KeyRegistry,
    TrustedKey,
    TrustFiles,
    ensure_keypair,
    ensure_signer_keys,
    key_id,
    load_public_key,
    local_signer,
    read_revoked,
    registry_from_files,
    role_of,
    write_public_key,
)
from schemas.events.v1 import NodeAction, OpsActionName


def trusted(role: str) -> TrustedKey:
    public = Ed25519PrivateKey.generate().public_key()
    return TrustedKey(key_id(public), public, role)


def test_every_node_action_has_a_signer_and_no_action_two_but_the_executors_probes() -> None:
    every = {cls.model_fields["action"].default for cls in get_args(NodeAction)}
    signed = set().union(*(SIGNER_ACTIONS[role] for role in SIGNER_ROLES))
    assert signed == every
    assert SIGNER_ACTIONS["executor"] == set(get_args(OpsActionName))
    assert SIGNER_ACTIONS["router"] == {"run_inference"}
    assert SIGNER_ACTIONS["collector"] == {"probe_node", "set_peers", "set_report_interval"}
    # The disruptive actions are the executor's alone.
    for action in ("drain_node", "offline_node", "migrate_job", "stop_job", "cancel"):
        assert [r for r in SIGNER_ROLES if action in SIGNER_ACTIONS[r]] == ["executor"]


@pytest.mark.parametrize(("role", "action", "refusal"), [
    ("executor", "drain_node", None),
    ("executor", "run_inference", "action_not_allowed"),
    ("collector", "probe_node", None),
    ("collector", "set_peers", None),
    ("collector", "drain_node", "action_not_allowed"),
    ("collector", "offline_node", "action_not_allowed"),
    ("router", "run_inference", None),
    ("router", "migrate_job", "action_not_allowed"),
    ("shared", "drain_node", None),
    ("shared", "run_inference", None),
])
def test_a_key_may_sign_only_its_roles_actions(role: str, action: str,
                                               refusal: str | None) -> None:
    key = trusted(role)
    assert KeyRegistry.of([key]).refusal(key.kid, action) == refusal


def test_a_revoked_kid_is_refused_whatever_the_action_and_an_unknown_one_too() -> None:
    old, new = trusted("executor"), trusted("executor")
    registry = KeyRegistry.of([old, new], revoked=[old.kid])
    assert registry.refusal(old.kid, "probe_node") == "revoked_kid"
    assert registry.refusal(new.kid, "drain_node") is None
    assert registry.refusal("cw-nobody", "probe_node") == "unknown_kid"


def test_one_key_cannot_be_trusted_for_two_roles_nor_for_a_role_nobody_has() -> None:
    key = trusted("collector")
    with pytest.raises(ValueError, match="collector and executor"):
        KeyRegistry.of([key, TrustedKey(key.kid, key.public, "executor")])
    with pytest.raises(ValueError, match="unknown signer role"):
        KeyRegistry.of([trusted("scheduler")])
    # The same file listed twice is one key.
    assert list(KeyRegistry.of([key, key]).keys) == [key.kid]


@pytest.mark.parametrize(("name", "role"), [
    ("executor.pub", "executor"),
    ("collector.pub", "collector"),
    ("router.2027-01.pub", "router"),
    ("command-signing.pub", "shared"),
    ("command-signing.cw-abc.pub", "shared"),
])
def test_a_key_files_name_gives_its_role(name: str, role: str) -> None:
    assert role_of(Path("/keys") / name) == role


@pytest.mark.parametrize("name", ["api.pub", "cw-abc.pub", "shared.pub", "executorx.pub"])
def test_a_key_file_named_for_no_signer_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"<role>\.pub"):
        role_of(Path(name))


def test_each_signer_makes_its_own_pair_once(tmp_path: Path) -> None:
    publics = ensure_signer_keys(tmp_path)
    assert [p.name for p in publics] == ["executor.pub", "collector.pub", "router.pub"]
    kids = {key_id(load_public_key(p)) for p in publics}
    assert len(kids) == 3
    assert ensure_signer_keys(tmp_path) == publics
    assert {key_id(load_public_key(p)) for p in publics} == kids
    assert oct(os.stat(tmp_path / "router.key").st_mode & 0o777) == "0o600"
    signer = local_signer("", str(tmp_path.parent), "collector")
    assert (tmp_path.parent / "keys" / "collector.key").exists()
    assert signer.kid == key_id(load_public_key(tmp_path.parent / "keys" / "collector.pub"))


def test_a_trusted_folder_is_its_pub_files_each_with_its_role(tmp_path: Path) -> None:
    ensure_signer_keys(tmp_path)
    ensure_keypair(tmp_path, "executor.next")
    registry = registry_from_files([tmp_path])
    assert sorted(k.role for k in registry.keys.values()) == [
        "collector", "executor", "executor", "router"]


def test_the_revoked_file_has_one_kid_a_line_with_comments(tmp_path: Path) -> None:
    path = tmp_path / "revoked"
    assert read_revoked(path) == frozenset()
    assert read_revoked(None) == frozenset()
    path.write_text("# leaked 2026-12-01\ncw-aaa\n\n  cw-bbb  # rotated\n")
    assert read_revoked(path) == {"cw-aaa", "cw-bbb"}


def test_trust_files_are_read_again_when_a_key_is_added_or_revoked(tmp_path: Path) -> None:
    keys, revoked = tmp_path / "keys", tmp_path / "revoked"
    ensure_signer_keys(keys)
    trust = TrustFiles([keys], revoked)
    first = trust()
    assert trust() is first  # nothing changed: not read again

    _, new_public = ensure_keypair(keys, "executor.next")
    new_kid = key_id(load_public_key(new_public))
    assert trust().keys[new_kid].role == "executor"

    old_kid = key_id(load_public_key(keys / "executor.pub"))
    revoked.write_text(f"{old_kid}\n")
    assert trust().refusal(old_kid, "drain_node") == "revoked_kid"
    assert trust().refusal(new_kid, "drain_node") is None


def test_a_trusted_key_that_turns_unreadable_leaves_the_previous_trust(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    ensure_signer_keys(keys)
    trust = TrustFiles([keys])
    before = trust()
    (keys / "router.2027.pub").write_text("half a key")
    assert trust() is before
    write_public_key(keys / "router.2027.pub", Ed25519PrivateKey.generate().public_key())
    assert len(trust().keys) == 4


def test_an_agent_refuses_to_start_with_a_key_named_for_no_signer(tmp_path: Path) -> None:
    _, public = ensure_keypair(tmp_path, "scheduler")
    with pytest.raises(ValueError, match=r"<role>\.pub"):
        TrustFiles([public])
