"""The needs of the method on the real broker, Redis and agent processes: scale-out when a
pool holds above its range (and not for a spike), load balance when one node leaves its
range, offline when an agent dies, online when a repaired node stays healthy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent import fleet
from schemas.events.v1 import OpsNeed
from schemas.topics import Topic
from services.shared.registry import register
from services.shared.signing import ensure_keypair
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    is_success_of,
    is_up,
    name,
    services,
    stack_env,
    tap,
)

pytestmark = pytest.mark.integration

NODES = ("node-001", "node-002", "node-003")


def needs_of(watch: Tap, kind: str) -> list[OpsNeed]:
    return [n for n in (OpsNeed.model_validate_json(r.value) for r in watch.records
                        if r.topic.endswith(Topic.OPS_NEEDS.value)) if n.kind == kind]


def a_need(kind: str, target: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.OPS_NEEDS.value):
            return False
        need = OpsNeed.model_validate_json(record.value)
        return need.kind == kind and need.target == target
    return check


async def drain(watch: Tap, seconds: float) -> None:
    """Keep reading for `seconds` (so records published meanwhile are seen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batches = await watch.consumer.getmany(timeout_ms=200)
        for recs in batches.values():
            watch.records.extend(recs)


def load(state: Path, percent: float, nodes: tuple[str, ...] = NODES) -> None:
    for node in nodes:
        fleet.inject_fault(state, node, load_pct=percent)


async def test_scale_out_after_the_hold_not_for_a_spike_and_load_balance_for_one_hot_node(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_POOL_PERIOD_S="1", ANALYZER_SCALE__HOLD_S="15",
                    ANALYZER_LOAD_BALANCE__HOLD_S="4")
    _, public = ensure_keypair(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        for node in NODES:  # the load is set before the first report
            fleet.inject_fault(tmp_path, node, load_pct=40.0)
        agents = fleet.fleet_up(3, 1, "itest", namespace, tmp_path, env, [public], 1.0)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_POOL_HEALTH, namespace)) as watch:
                await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.OPS_POOL_HEALTH.value)
                    and b'"up":3' in r.value, 60, "the pool's health with 3 nodes up")

                # One node at 90% while the pool is inside its range: load balance.
                fleet.inject_fault(tmp_path, "node-001", load_pct=90.0)
                record = await watch.wait_for(a_need("load_balance", "node-001"), 40,
                                              "a load-balance need for node-001")
                balance = OpsNeed.model_validate_json(record.value)
                assert balance.evidence[0].value > 80.0
                fleet.inject_fault(tmp_path, "node-001", load_pct=40.0)

                # A 8-second spike of the whole pool, shorter than the 15 s hold: nothing.
                load(tmp_path, 95.0)
                await drain(watch, 8.0)
                load(tmp_path, 40.0)
                await drain(watch, 6.0)
                assert needs_of(watch, "scale_out") == []

                # Held at 85%: scale out, once.
                held_from = time.monotonic()
                load(tmp_path, 85.0)
                record = await watch.wait_for(a_need("scale_out", "default"), 60,
                                              "a scale-out need")
                assert time.monotonic() - held_from >= 15.0
                scale_out = OpsNeed.model_validate_json(record.value)
                assert scale_out.level == "cluster"
                assert 80.0 < scale_out.evidence[0].value <= 95.0
                await drain(watch, 3.0)
                assert len(needs_of(watch, "scale_out")) == 1
                assert {n.target for n in needs_of(watch, "load_balance")} == {"node-001"}
        finally:
            fleet.fleet_down(tmp_path)


async def test_a_killed_agent_is_down_within_the_grace_and_a_repaired_node_comes_back_online(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    COLLECTOR_DOWN_AFTER_S="4", ANALYZER_ONLINE__HOLD_S="3",
                    **SMALL_POOL_SAFETY)
    _, public = ensure_keypair(tmp_path / "keys")
    async with services(env, tmp_path):
        agents = fleet.fleet_up(3, 1, "itest", namespace, tmp_path, env, [public], 1.0)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_TASK_EVENTS, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 60, f"{node} up")

                # A dead agent: down within the grace period, then an offline need.
                killed_at = time.monotonic()
                fleet.kill_agent(tmp_path, "node-003")
                await watch.wait_for(
                    lambda r: r.key == b"node-003" and b'"state":"down"' in r.value, 30,
                    "node-003 down")
                down_after = time.monotonic() - killed_at
                record = await watch.wait_for(a_need("offline", "node-003"), 30,
                                              "an offline need for the dead node")
                need = OpsNeed.model_validate_json(record.value)
                assert need.evidence[0].metric == "heartbeat_missed"
                assert down_after < 4.0 + 3.0  # the grace, plus a sweep and a report interval

                # A GPU fault takes node-002 offline; repaired, it comes back after the hold.
                fleet.inject_fault(tmp_path, "node-002", xid=[79])
                await watch.wait_for(
                    is_success_of(watch, "node-002"), 90, "node-002 taken offline")
                await asyncio.sleep(1.0)
                repaired_at = time.monotonic()
                fleet.clear_faults(tmp_path, "node-002")
                record = await watch.wait_for(a_need("online", "node-002"), 60,
                                              "an online need for the repaired node")
                assert time.monotonic() - repaired_at >= 3.0
                online = OpsNeed.model_validate_json(record.value)
                assert online.level == "node"
            print(f"\nkilled agent -> down: {down_after:.2f} s")
        finally:
            fleet.fleet_down(tmp_path)
