"""What the centre gives the standby agents it starts: the environment they inherit and the
signers' public keys (pure; the centre itself is in tests/service/executor/test_centre.py)."""

from __future__ import annotations

from pathlib import Path

from common.signing import ensure_keypair, key_id, load_public_key, role_of, signer_from_file
from services.executor.centre import agent_environment, signer_public_keys


def test_standby_agents_inherit_only_what_they_need() -> None:
    env = {"WARDEN_NAMESPACE": "x", "KAFKA_BOOTSTRAP_SERVERS": "k", "PATH": "/bin",
           "REDIS_URL": "redis://", "EXECUTOR_SIGNING_KEY": "/secret", "AGENT_JOBS": ""}
    assert agent_environment(env) == {"WARDEN_NAMESPACE": "x", "KAFKA_BOOTSTRAP_SERVERS": "k",
                                      "PATH": "/bin", "AGENT_JOBS": ""}


def test_standby_agents_trust_every_signer_each_for_its_role(tmp_path: Path) -> None:
    trusted = signer_public_keys("", str(tmp_path))
    assert sorted(role_of(p) for p in trusted) == ["collector", "executor", "router"]
    assert signer_public_keys("", str(tmp_path)) == trusted


def test_the_public_half_of_a_configured_signing_key_is_written_for_agents(
    tmp_path: Path,
) -> None:
    private, _ = ensure_keypair(tmp_path / "elsewhere", "executor")
    public, *others = signer_public_keys(str(private), str(tmp_path / "state"))
    signer = signer_from_file(private)
    assert key_id(load_public_key(public)) == signer.kid
    # Trusted for the executor's actions, not as the state folder's own executor key.
    assert role_of(public) == "executor"
    assert sorted(role_of(p) for p in others) == ["collector", "router"]
    assert signer_public_keys(str(private), str(tmp_path / "state"))[0] == public


def test_a_configured_shared_key_is_trusted_as_shared(tmp_path: Path) -> None:
    private, _ = ensure_keypair(tmp_path / "elsewhere", "command-signing")
    public, *_ = signer_public_keys(str(private), str(tmp_path / "state"))
    assert role_of(public) == "shared"
