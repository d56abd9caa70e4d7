"""What the centre gives the standby agents it starts: the environment they inherit and the
executor's public key (pure; the centre itself is in tests/service/executor/test_centre.py)."""

from __future__ import annotations

from pathlib import Path

from common.signing import ensure_keypair, key_id, load_public_key, signer_from_file
from services.executor.centre import agent_environment, executor_public_key


def test_standby_agents_inherit_only_what_they_need() -> None:
    env = {"WARDEN_NAMESPACE": "x", "KAFKA_BOOTSTRAP_SERVERS": "k", "PATH": "/bin",
           "REDIS_URL": "redis://", "EXECUTOR_SIGNING_KEY": "/secret", "AGENT_JOBS": ""}
    assert agent_environment(env) == {"WARDEN_NAMESPACE": "x", "KAFKA_BOOTSTRAP_SERVERS": "k",
                                      "PATH": "/bin", "AGENT_JOBS": ""}


def test_the_public_half_of_a_configured_signing_key_is_written_for_agents(
    tmp_path: Path,
) -> None:
    private, _ = ensure_keypair(tmp_path / "elsewhere")
    public = executor_public_key(str(private), str(tmp_path / "state"))
    signer = signer_from_file(private)
    assert key_id(load_public_key(public)) == signer.kid
    assert executor_public_key(str(private), str(tmp_path / "state")) == public
