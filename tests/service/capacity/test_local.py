"""The local capacity provider against the real redis-server, with real agent processes.

The agents point at a closed loopback port for Kafka (as the fleet tests do): they start,
log their settings and wait for a broker, which is all a start/stop test needs, and cheap
(no jobs: AGENT_JOBS is empty for standby nodes).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent import fleet
from common.signing import ensure_signer_keys
from services.capacity.local import LocalProvider
from services.capacity.provider import (
    PROVIDERS,
    NodeOffer,
    NoneProvider,
    NotSupportedError,
    ProviderContext,
    build_provider,
)
from services.capacity.settings import CapacitySettings
from services.shared.redis_client import Keys, text
from services.shared.registry import register_nodes, registered_nodes
from tests.ports import free_port

CLUSTER = "c1"






class Recorder:
    """Stands in for agent.fleet start/stop where no process is wanted."""

    def __init__(self, fail: bool = False) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.fail = fail

    def start(self, node_id: str, **fields: Any) -> fleet.AgentProcess:
        if self.fail:
            raise OSError("no more processes")
        self.started.append(node_id)
        return fleet.AgentProcess(node_id, 1, Path("/nonexistent"), Path("/nonexistent"))

    def stop(self, state_dir: Path, node_id: str, timeout_s: float = 15.0) -> bool:
        self.stopped.append(node_id)
        return True


def provider(redis: Redis, keys: Keys, tmp_path: Path, recorder: Recorder | None = None,
             standby: tuple[tuple[str, int], ...] = (("standby-1", 2), ("standby-2", 8)),
             ) -> LocalProvider:
    trusted = ensure_signer_keys(tmp_path / "keys")
    extra: dict[str, Any] = {}
    if recorder is not None:
        extra = {"start": recorder.start, "stop": recorder.stop}
    return LocalProvider(
        redis, keys, list(standby), state_dir=tmp_path, namespace="captest",
        env={"PATH": os.environ.get("PATH", ""),
             "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"},
        trusted_keys=trusted, interval_s=0.5, stop_timeout_s=15.0, **extra,
    )


def wait_for_log(path: Path, needle: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    content = ""
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if needle in content:
            return content
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not in {path}:\n{content}")


async def test_acquire_starts_a_standby_agent_and_release_stops_it(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    local = provider(redis, keys, tmp_path)
    starts: list[str] = []

    def counting_start(node_id: str, **fields: Any) -> fleet.AgentProcess:
        starts.append(node_id)
        return fleet.start_agent(node_id, **fields)

    local._start = counting_start
    assert await local.standby(CLUSTER, "default") == [NodeOffer("standby-1", 2),
                                                       NodeOffer("standby-2", 8)]
    try:
        assert await local.acquire(CLUSTER, "default", ["standby-1"], "req-1") == ["standby-1"]
        pid = fleet.read_pid(tmp_path, "standby-1")
        assert pid is not None
        assert fleet.is_alive(pid)
        # Enrolled (its reports count), recorded, and no longer offered.
        assert await registered_nodes(redis, keys, CLUSTER) == ["standby-1"]
        assert await local.owned(CLUSTER, "default") == ["standby-1"]
        assert await local.owned(CLUSTER, "other") == []
        assert await local.standby(CLUSTER, "other") == [NodeOffer("standby-2", 8)]
        # A standby agent: no jobs, its own GPUs and pool.
        log = wait_for_log(fleet.log_path(tmp_path, "standby-1"), "GPU source")
        assert "SIMULATED (2 GPUs)" in log or "NVML" in log

        # The same request again starts nothing and answers the same nodes.
        assert await local.acquire(CLUSTER, "default", ["standby-1"], "req-1") == ["standby-1"]
        assert starts == ["standby-1"]
        assert fleet.read_pid(tmp_path, "standby-1") == pid

        assert await local.release(CLUSTER, "standby-1", "req-2") is True
        assert not fleet.is_alive(pid)
        assert fleet.read_pid(tmp_path, "standby-1") is None
        assert await registered_nodes(redis, keys, CLUSTER) == []
        assert await local.owned(CLUSTER, "default") == []
        assert len(await local.standby(CLUSTER, "default")) == 2
        # Repeated, the release answers as before; another release finds nothing of ours.
        assert await local.release(CLUSTER, "standby-1", "req-2") is True
        assert await local.release(CLUSTER, "standby-1", "req-3") is False
    finally:
        fleet.stop_agent(tmp_path, "standby-1")


async def test_two_requests_never_get_the_same_node(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    recorder = Recorder()
    local = provider(redis, keys, tmp_path, recorder)
    first, second = await asyncio.gather(
        local.acquire(CLUSTER, "a", ["standby-1", "standby-2"], "r1"),
        local.acquire(CLUSTER, "b", ["standby-1", "standby-2"], "r2"),
    )
    assert sorted(first + second) == ["standby-1", "standby-2"]
    assert not set(first) & set(second)
    assert sorted(recorder.started) == ["standby-1", "standby-2"]
    assert await local.standby(CLUSTER, "a") == []


async def test_a_node_enrolled_by_someone_else_is_neither_offered_nor_started(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    recorder = Recorder()
    local = provider(redis, keys, tmp_path, recorder)
    await register_nodes(redis, keys, CLUSTER, ["standby-2"])  # a fleet node of that name
    assert await local.standby(CLUSTER, "default") == [NodeOffer("standby-1", 2)]
    assert await local.acquire(CLUSTER, "default", ["standby-2"], "r1") == []
    assert recorder.started == []
    assert await local.release(CLUSTER, "standby-2", "r2") is False
    assert recorder.stopped == []
    assert await registered_nodes(redis, keys, CLUSTER) == ["standby-2"]


async def test_a_failed_start_hands_the_claim_back(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    local = provider(redis, keys, tmp_path, Recorder(fail=True))
    with pytest.raises(OSError, match="no more processes"):
        await local.acquire(CLUSTER, "default", ["standby-1"], "r1")
    assert await registered_nodes(redis, keys, CLUSTER) == []
    assert await local.owned(CLUSTER, "default") == []
    assert len(await local.standby(CLUSTER, "default")) == 2
    assert not await redis.exists(keys.capacity_request("r1"))


async def test_an_interrupted_request_is_finished_when_repeated(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    recorder = Recorder()
    local = provider(redis, keys, tmp_path, recorder)
    # As if the executor died after claiming, before the agents were started.
    await local._claim(
        keys=[keys.capacity_request("r1"), local.in_use_key(CLUSTER),
              keys.capacity_nodes(CLUSTER, "default"), keys.registry(CLUSTER)],
        args=["default", 60, "standby-1", "{}"])
    assert await local.acquire(CLUSTER, "default", ["standby-1"], "r1") == ["standby-1"]
    assert recorder.started == ["standby-1"]
    record = text(await redis.get(keys.capacity_request("r1")) or b"")
    assert '"state": "done"' in record


async def test_unknown_nodes_are_refused(redis: Redis, keys: Keys, tmp_path: Path) -> None:
    local = provider(redis, keys, tmp_path, Recorder())
    with pytest.raises(ValueError, match="not standby nodes"):
        await local.acquire(CLUSTER, "default", ["node-001"], "r1")


# ---------------------------------------------------------------- the provider registry


async def test_the_registry_builds_each_provider(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    assert list(PROVIDERS) == ["local", "none"]

    def context(name: str) -> ProviderContext:
        return ProviderContext(redis=redis, keys=keys,
                               settings=CapacitySettings(provider=name, local_standby="1"),
                               state_dir=tmp_path, namespace="n")

    local = build_provider(context("local"))
    assert isinstance(local, LocalProvider)
    assert local.standby_nodes == {"standby-1": 2}
    assert local.state_dir == tmp_path.resolve()  # noqa: ASYNC240
    none = build_provider(context("none"))
    assert isinstance(none, NoneProvider)
    assert await none.standby(CLUSTER, "default") == []
    assert await none.acquire(CLUSTER, "default", ["x"], "r") == []
    assert await none.release(CLUSTER, "x", "r") is False
    assert await none.owned(CLUSTER, "default") == []
    with pytest.raises(ValueError, match="unknown capacity provider 'cloud'"):
        build_provider(context("cloud"))


async def test_restart_agent_starts_a_dead_agent_again_from_its_state_dir(
    redis: Redis, keys: Keys, tmp_path: Path
) -> None:
    local = provider(redis, keys, tmp_path)
    trusted = ensure_signer_keys(tmp_path / "keys")
    # A fleet node (not a standby one), started the way `warden fleet up` starts it.
    first = fleet.start_agent("node-007", gpus=3, cluster_id=CLUSTER, namespace="captest",
                              state_dir=tmp_path, env=local.env, trusted_keys=trusted,
                              interval_s=0.5, jobs="")
    try:
        wait_for_log(fleet.log_path(tmp_path, "node-007"), "GPU source")
        assert fleet.kill_agent(tmp_path, "node-007")
        await local.restart_agent(CLUSTER, "node-007", "restart-1")
        again = fleet.read_pid(tmp_path, "node-007")
        assert again is not None
        assert again != first.pid
        assert fleet.is_alive(again)
        # As it was started: its own GPUs, cluster and (no) jobs, from its launch record.
        launch = fleet.read_launch(tmp_path, "node-007")
        assert launch is not None
        assert (launch["gpus"], launch["cluster_id"], launch["jobs"]) == (3, CLUSTER, "")
        # Both runs log to the node's log: the restarted agent got as far as its devices.
        log = fleet.log_path(tmp_path, "node-007")
        deadline = time.monotonic() + 30.0
        while log.read_text().count("GPU source") < 2:
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        # The same request again restarts nothing.
        await local.restart_agent(CLUSTER, "node-007", "restart-1")
        assert fleet.read_pid(tmp_path, "node-007") == again
        # A node this machine never started cannot be restarted from here.
        with pytest.raises(NotSupportedError, match="no launch record"):
            await local.restart_agent(CLUSTER, "node-999", "restart-2")
    finally:
        fleet.stop_agent(tmp_path, "node-007")
