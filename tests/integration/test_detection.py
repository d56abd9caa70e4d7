"""Detection in depth on the real broker, Redis and agent processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis

from agent import fleet
from schemas.events.v1 import OpsNeed
from schemas.topics import Topic
from services.shared.redis_client import Keys
from services.shared.registry import register
from services.shared.signing import ensure_keypair
from tests.integration.harness import Record, Tap, name, services, stack_env, tap, until


def is_need_number(needs: Tap, n: int) -> Callable[[Record], bool]:
    """True once the (n+1)th need has arrived."""
    def check(record: Record) -> bool:
        return len(needs.records) > n
    return check


def need_for(node: str, metric: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        need = OpsNeed.model_validate_json(record.value)
        return need.target == node and any(e.metric == metric for e in need.evidence)
    return check


async def test_a_node_that_reports_but_does_not_answer_probes_is_taken_offline(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    COLLECTOR_PROBE_PERIOD_S="2", COLLECTOR_PROBE_DEADLINE_S="2")
    _, public = ensure_keypair(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        # node-001 trusts the centre's key and answers; node-002 trusts no key, so every
        # command to it (probes included) is refused unread: it reports, but never answers.
        healthy = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, [public], 1.0)
        deaf = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, [], 1.0, first=2)
        await register(redis_url, namespace, "itest", [a.node_id for a in healthy + deaf])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace)) as needs:
                record = await needs.wait_for(need_for("node-002", "node_fault_count"), 90,
                                              "an offline need for the node that never answers")
                need = OpsNeed.model_validate_json(record.value)
                assert need.kind == "offline"
                assert "probe_failed" in need.evidence[0].detail
                # The node that answers its probes raised nothing.
                assert not [r for r in needs.records
                            if json.loads(r.value)["target"] == "node-001"]
            redis = Redis.from_url(redis_url)
            try:
                keys = Keys(namespace)

                async def answered() -> bool:
                    return bool(await redis.hget(keys.node("itest", "node-001"), "probe_ok_at"))

                await until(answered, 30, "node-001 to answer a centre probe")
                failures = await redis.hget(keys.node("itest", "node-002"), "probe_failures")
                assert failures is not None
                assert int(failures) >= 1
            finally:
                await redis.aclose()
        finally:
            fleet.fleet_down(tmp_path)


async def test_a_gpu_that_keeps_failing_is_escalated_to_replace(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # XID 48 (double-bit ECC) calls for a reboot; the third episode on the same GPU within
    # the window escalates to replace. Open needs expire at once so each episode is seen.
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_OFFLINE__FAULTS__REPEAT_THRESHOLD="3",
                    ANALYZER_OPEN_NEED_TTL_S="1")
    _, public = ensure_keypair(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        agents = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, [public], 0.5)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace)) as needs:
                classes = []
                for episode in range(3):
                    fleet.inject_fault(tmp_path, "node-001", xid=[48])
                    record = await needs.wait_for(is_need_number(needs, episode), 30,
                                                  f"the offline need of episode {episode + 1}")
                    classes.append(OpsNeed.model_validate_json(record.value).action_class)
                    fleet.inject_fault(tmp_path, "node-001", xid=[])
                    await asyncio.sleep(2.5)  # healthy reports end the episode
                assert classes == ["reboot", "reboot", "replace"]
                last = OpsNeed.model_validate_json(needs.records[-1].value)
                assert "3 fatal faults within" in " ".join(e.detail for e in last.evidence)
        finally:
            fleet.fleet_down(tmp_path)


async def test_a_probe_answer_is_judged_by_when_it_was_sent_not_when_it_was_read(
    redis_url: str, namespace: str
) -> None:
    from datetime import timedelta

    from schemas.events.v1 import now_utc
    from services.collector.store import ProbeStore

    redis = Redis.from_url(redis_url)
    probes = ProbeStore(redis, Keys(namespace))
    node_key = Keys(namespace).node("itest", "node-001")
    try:
        now = now_utc()
        deadline = now - timedelta(seconds=1)
        await probes.pending("p1", "itest", "node-001", deadline.timestamp())
        await probes.pending("p2", "itest", "node-001", deadline.timestamp())
        assert sorted(await probes.expired(now)) == ["p1", "p2"]
        # The centre was behind: both deadlines passed before it read any answer.
        assert await probes.end("p1", answered=False, now=now) == ("itest:node-001", 1)
        assert await probes.end("p2", answered=False, now=now) == ("itest:node-001", 2)
        # p1's answer was sent after its deadline: a real failure, it stays counted.
        late = deadline + timedelta(seconds=0.5)
        assert await probes.end("p1", answered=True, now=now, sent_at=late) is None
        assert int(await redis.hget(node_key, "probe_failures") or 0) == 2
        # p2's answer was sent in time and only read late: the failures were the centre's.
        in_time = deadline - timedelta(seconds=0.5)
        assert await probes.end("p2", answered=True, now=now, sent_at=in_time) == (
            "itest:node-001", 0)
        assert int(await redis.hget(node_key, "probe_failures") or 0) == 0
        # Read twice, counted once.
        assert await probes.end("p2", answered=True, now=now, sent_at=in_time) is None
    finally:
        await redis.aclose()
