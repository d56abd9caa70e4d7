"""Detection in depth on the real broker, Redis and agent processes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from redis.asyncio import Redis

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import OpsNeed, Sample, SampleBatch, now_utc
from schemas.topics import Topic
from services.shared.redis_client import Keys
from services.shared.registry import register
from tests.integration.harness import (
    Record,
    Tap,
    name,
    processed,
    services,
    stack_env,
    tap,
    until,
    watched_fleet,
)

# Samples of a node the analyzer must have handled before a need for it is judged absent.
SAMPLES_AFTER = 3


def is_need(record: Record) -> bool:
    return record.topic.endswith(Topic.OPS_NEEDS.value)


def needs_in(events: Tap) -> list[OpsNeed]:
    return [OpsNeed.model_validate_json(r.value) for r in events.records if is_need(r)]


def samples_in(record: Record) -> list[Sample]:
    if not record.topic.endswith(Topic.OPS_SAMPLES.value):
        return []
    return SampleBatch.model_validate_json(record.value).samples


async def samples_of(events: Tap, node: str, count: int, *, start: int) -> list[Record]:
    """The next `count` sample batches (from index `start` of `events.records` on) that
    carry a sample of `node`."""
    found: list[Record] = []
    while len(found) < count:
        record = await events.wait_for(
            lambda r: any(s.node_id == node for s in samples_in(r)), 60,
            f"sample {len(found) + 1} of {count} of {node}", start=start)
        found.append(record)
        start = next(i for i, r in enumerate(events.records) if r is record) + 1
    return found


def healthy_since(node: str, since: datetime) -> Callable[[Record], bool]:
    """A sample batch with a fault-free sample of `node` reported at `since` or later."""
    return lambda record: any(s.node_id == node and s.fault_count == 0
                              and s.reported_at >= since for s in samples_in(record))


async def analyzer_past(bootstrap: str, namespace: str, records: list[Record],
                        what: str) -> None:
    """Wait until the analyzer has handled these sample batches (its consumer group,
    services/analyzer/app.py, has committed past them)."""
    group = f"{namespace}.analyzer-samples"
    await until(lambda: processed(bootstrap, group, records), 60, what)


def need_for(node: str, metric: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not is_need(record):
            return False
        need = OpsNeed.model_validate_json(record.value)
        return need.target == node and any(e.metric == metric for e in need.evidence)
    return check


async def test_a_node_that_reports_but_does_not_answer_probes_is_taken_offline(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    COLLECTOR_PROBE_PERIOD_S="2", COLLECTOR_PROBE_DEADLINE_S="2")
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        # node-001 trusts the centre's key and answers; node-002 trusts no key, so every
        # command to it (probes included) is refused unread: it reports, but never answers.
        healthy = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        deaf = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, [], 1.0, first=2)
        await register(redis_url, namespace, "itest", [a.node_id for a in healthy + deaf])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_SAMPLES, namespace)) as watch:
                record = await watch.wait_for(need_for("node-002", "node_fault_count"), 90,
                                              "an offline need for the node that never answers")
                need = OpsNeed.model_validate_json(record.value)
                assert need.kind == "offline"
                assert "probe_failed" in need.evidence[0].detail
                # The node that answers its probes raised nothing: judged once the analyzer
                # has handled SAMPLES_AFTER of node-001's samples published after that need
                # (probed alike, it would have been found out by then).
                later = await samples_of(watch, "node-001", SAMPLES_AFTER,
                                         start=len(watch.records))
                await analyzer_past(kafka_bootstrap, namespace, later,
                                    f"the analyzer past {SAMPLES_AFTER} more samples of node-001")
                await watch.catch_up()
                assert not [n for n in needs_in(watch) if n.target == "node-001"]
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
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        agents = fleet.fleet_up(1, 1, "itest", namespace, tmp_path, env, trusted, 0.5)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_SAMPLES, namespace)) as watch:
                redis = Redis.from_url(redis_url)
                open_need = Keys(namespace).open_need("itest", "offline", "node-001")

                async def closed() -> bool:
                    return not await redis.exists(open_need)

                classes = []
                try:
                    for episode in range(3):
                        fleet.inject_fault(tmp_path, "node-001", xid=[48])
                        record = await watch.wait_for(
                            is_need, 30, f"the offline need of episode {episode + 1}",
                            start=len(watch.records))
                        classes.append(OpsNeed.model_validate_json(record.value).action_class)
                        fleet.inject_fault(tmp_path, "node-001", xid=[])
                        # A healthy report ends the episode, once the analyzer has handled
                        # its sample; and the need is no longer open (it would hide the next).
                        healthy = await watch.wait_for(
                            healthy_since("node-001", now_utc()), 60,
                            "a healthy sample of node-001", start=len(watch.records))
                        await analyzer_past(kafka_bootstrap, namespace, [healthy],
                                            "the analyzer past the healthy sample")
                        await until(closed, 30, "the episode's need no longer open")
                finally:
                    await redis.aclose()
                assert classes == ["reboot", "reboot", "replace"]
                await watch.catch_up()
                raised = needs_in(watch)
                assert len(raised) == 3, raised
                assert "3 fatal faults within" in " ".join(e.detail for e in raised[-1].evidence)
        finally:
            fleet.fleet_down(tmp_path)


async def test_a_probe_answer_is_judged_by_when_it_was_sent_not_when_it_was_read(
    redis_url: str, namespace: str
) -> None:
    from datetime import timedelta

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


async def test_a_full_disk_held_for_a_while_takes_the_node_offline_with_the_evidence(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # Reports every second; a disk above 95 % must last 4 reports in a row.
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    ANALYZER_OFFLINE__HOST__MIN_CONSECUTIVE_REPORTS="4")
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with (services(env, tmp_path, ("collector", "analyzer")),
                watched_fleet(env, tmp_path, trusted, (Topic.OPS_NEEDS, Topic.OPS_SAMPLES),
                              count=2) as watch):
        await samples_of(watch, "node-001", 2, start=0)
        fleet.inject_fault(tmp_path, "node-001", disk_used_pct=98.5)
        record = await watch.wait_for(need_for("node-001", "node_fault_count"), 90,
                                      "an offline need for the full disk")
        need = OpsNeed.model_validate_json(record.value)
        assert (need.kind, need.level, need.action_class) == ("offline", "node",
                                                              "drain")
        assert "disk 98.5% used > 95%" in need.evidence[0].detail
        consecutive = int(need.evidence[0].detail.split(" consecutive")[0])
        assert consecutive >= 4, need.evidence[0].detail
        # The sample behind it carried the disk as the agent reported it.
        assert any(s.node_id == "node-001" and s.disk_used_pct == 98.5
                   for r in watch.records for s in samples_in(r))
        assert not [n for n in needs_in(watch) if n.target == "node-002"]
