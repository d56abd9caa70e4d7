"""A cluster's backend in the registry, on the real Redis: `warden cluster register` names it
(and enrols the nodes), `warden cluster show` reads it back, a cluster never registered is
`local`, and a backend ClusterWarden does not have is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar
from uuid import uuid4

import pytest
from redis.asyncio import Redis
from typer.testing import CliRunner

from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import LOCAL, ClusterBackend, cluster_backend, registered_nodes
from warden.cli import app

T = TypeVar("T")


def read(redis_url: str, query: Callable[[Redis], Awaitable[T]]) -> T:
    """One query on a connection of its own (the CLI runs its own event loops)."""
    async def run() -> T:
        redis = connect_redis(redis_url)
        try:
            return await query(redis)
        finally:
            await redis.aclose()
    return asyncio.run(run())


@pytest.fixture
def keys(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Keys]:
    """A namespace of this test's own for the CLI, its keys removed after."""
    namespace = f"c{uuid4().hex[:12]}"
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("WARDEN_NAMESPACE", namespace)
    monkeypatch.setenv("WARDEN_CLUSTER_ID", "gpu-east")
    keys = Keys(namespace)
    yield keys

    async def clean(redis: Redis) -> None:
        stale = [key async for key in redis.scan_iter(match=f"{keys.prefix}*")]
        if stale:
            await redis.delete(*stale)
    read(redis_url, clean)


def test_register_names_the_backend_and_enrols_the_nodes(redis_url: str, keys: Keys) -> None:
    def backend_of(cluster: str) -> ClusterBackend:
        return read(redis_url, lambda redis: cluster_backend(redis, keys, cluster))

    assert backend_of("gpu-east") == LOCAL
    runner = CliRunner()
    result = runner.invoke(app, ["cluster", "register", "--backend", "kubernetes",
                                 "--kubeconfig", "/etc/cw/east.kubeconfig",
                                 "--evictions-per-s", "2.5", "--eviction-burst", "3",
                                 "--default-pool", "train", "node-a", "node-b"])
    assert result.exit_code == 0, result.output
    assert "backend kubernetes, 2 node(s) enrolled" in result.output
    assert backend_of("gpu-east") == ClusterBackend(
        kind="kubernetes", kubeconfig="/etc/cw/east.kubeconfig", evictions_per_s=2.5,
        eviction_burst=3, default_pool="train")
    assert read(redis_url, lambda redis: registered_nodes(redis, keys, "gpu-east")) == [
        "node-a", "node-b"]
    assert backend_of("gpu-west") == LOCAL

    shown = runner.invoke(app, ["cluster", "show"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["kind"] == "kubernetes"
    assert json.loads(shown.output)["default_pool"] == "train"

    refused = runner.invoke(app, ["cluster", "register", "--backend", "slurm"])
    assert refused.exit_code != 0
    assert "unknown backend" in refused.output
    assert backend_of("gpu-east").kind == "kubernetes"
