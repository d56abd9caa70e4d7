"""The registry fed in batches on the real Redis: one round trip, in order, never backwards."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast
from uuid import uuid4

import pytest
from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaMessage
from redis.asyncio import Redis

from common.deadletter import DeadLetterPolicy
from common.reportauth import UNAUTHENTICATED, NodeReportKey, ReportAuthenticator, enrol_key
from schemas.events.v1 import NodeReport, ServedModel
from services.router.feed import ReportFeed
from services.router.registry import Registry
from services.shared.redis_client import Keys
from services.shared.registry import register_nodes
from tests.contracts.examples import examples
from tests.service.router.conftest import CLUSTER, T0
from tests.unit.router.test_registry_batch import MLP1, MLP2

OTHER = "other"


def report(node: str, seq: int, models: Sequence[ServedModel], *,
           cluster: str = CLUSTER) -> NodeReport:
    base = examples()["node_report"]
    return NodeReport.model_validate(base.model_dump() | {
        "event_id": uuid4(), "cluster_id": cluster, "subject": node, "node_id": node,
        "seq": seq, "occurred_at": T0 + timedelta(seconds=seq), "interval_s": 1.0,
        "models": [m.model_dump() for m in models]})


async def served_versions(registry: Registry, cluster: str = CLUSTER) -> dict[str, set[str]]:
    entries = await registry.entries(cluster, T0.timestamp() + 100.0)
    return {e.node: {m.version for m in e.models} for e in entries}


@pytest.fixture
async def registry(redis: Redis, keys: Keys) -> Registry:
    await register_nodes(redis, keys, CLUSTER, ["node-001", "node-002", "node-003"])
    await register_nodes(redis, keys, OTHER, ["node-101"])
    return Registry(redis, keys, cache_s=0.0)


async def test_a_batch_is_applied_in_order_in_one_round_trip(
        registry: Registry, redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    await registry.apply([report("node-003", 1, [MLP1])])  # the script is loaded from here on
    calls: list[Any] = []
    execute = cast(Callable[..., Awaitable[Any]], redis.execute_command)

    async def counted(*args: Any, **options: Any) -> Any:
        calls.append(args[0])
        return await execute(*args, **options)

    monkeypatch.setattr(redis, "execute_command", counted)
    applied = await registry.apply([
        report("node-001", 5, [MLP1]),
        report("node-101", 1, [MLP2], cluster=OTHER),
        report("node-002", 3, [MLP1, MLP2]),
        report("node-001", 4, [MLP2]),        # older than the one before it: ignored
        report("node-666", 9, [MLP1]),        # nobody enrolled it: serves nothing
        report("node-001", 6, [MLP1, MLP2]),  # newer again: kept
        report("node-003", 2, []),            # no models any more: leaves the registry
    ])
    assert calls == ["EVALSHA"]
    assert applied == ["kept", "kept", "kept", "old", "unknown", "kept", "kept"]
    assert await served_versions(registry) == {"node-001": {"1", "2"}, "node-002": {"1", "2"}}
    assert await served_versions(registry, OTHER) == {"node-101": {"2"}}
    assert len(calls) > 1  # entries() read Redis: the counting saw every command


async def test_a_replayed_batch_never_rolls_the_registry_back(registry: Registry) -> None:
    history = [report("node-001", seq, [MLP1] if seq < 8 else [MLP2]) for seq in range(1, 11)]
    history.append(report("node-002", 1, [MLP1]))
    assert (await registry.apply(history)).count("kept") == 11
    # The topic replayed from the start, in batches: nothing is newer than what is kept.
    assert await registry.apply(history[:5]) == ["old"] * 5
    assert await registry.apply(history) == ["old"] * 11
    older = [report("node-001", 9, []), report("node-001", 3, [MLP1])]
    assert await registry.apply(older) == ["old", "old"]
    assert await served_versions(registry) == {"node-001": {"2"}, "node-002": {"1"}}
    assert await registry.apply([]) == []


async def test_a_fresh_batch_is_seen_at_once_despite_the_cache(redis: Redis, keys: Keys) -> None:
    await register_nodes(redis, keys, CLUSTER, ["node-001"])
    registry = Registry(redis, keys, cache_s=3_600.0)
    assert await served_versions(registry) == {}
    await registry.apply([report("node-001", 1, [MLP1])])
    assert await served_versions(registry) == {"node-001": {"1"}}


Headers = tuple[tuple[str, bytes], ...]


def consumed(*items: tuple[bytes | None, bytes] | tuple[bytes | None, bytes, Headers]
             ) -> KafkaMessage:
    """A batch as the subscriber receives it: its raw consumer records."""
    records = [ConsumerRecord(topic="t.node.reports", partition=0, offset=i, timestamp=0,
                              timestamp_type=0, key=item[0], value=item[1], checksum=None,
                              serialized_key_size=0, serialized_value_size=len(item[1]),
                              headers=item[2] if len(item) == 3 else ())
               for i, item in enumerate(items)]
    return cast(KafkaMessage, SimpleNamespace(raw_message=tuple(records)))


def wire(event: NodeReport) -> tuple[bytes, bytes]:
    return event.node_id.encode(), event.model_dump_json().encode()


def signed(event: NodeReport, key: NodeReportKey) -> tuple[bytes, bytes, Headers]:
    """The report as its agent publishes it: the MAC of its exact bytes in the headers."""
    key_bytes, body = wire(event)
    return key_bytes, body, tuple((k, v.encode()) for k, v in key.headers(body).items())


async def test_the_feed_applies_a_batch_and_dead_letters_its_invalid_items(
        registry: Registry) -> None:
    letters: list[tuple[str, bytes | None, dict[str, str]]] = []

    async def publish(topic: str, key: bytes | None, value: bytes,
                      headers: dict[str, str]) -> None:
        letters.append((topic, key, headers))

    feed = ReportFeed(registry, DeadLetterPolicy("g", publish), max_message_bytes=65_536)
    newest = report("node-001", 7, [MLP2])
    batch = consumed(
        wire(newest),
        (b"node-002", b"{not json"),
        (b"node-003", report("node-002", 2, [MLP1]).model_dump_json().encode()),  # wrong key
        wire(report("node-001", 6, [MLP1])),  # out of order: older than the one before
        wire(report("node-002", 1, [MLP1])),
        (b"node-003", b"x" * 70_000),
    )
    await feed.on_reports([], batch)
    assert await served_versions(registry) == {"node-001": {"2"}, "node-002": {"1"}}
    assert [(topic, key, h["dlt-reason"], h["dlt-original-offset"])
            for topic, key, h in letters] == [
        ("t.node.reports.dlt", b"node-002", "json_invalid", "1"),
        ("t.node.reports.dlt", b"node-003", "key_mismatch", "2"),
        ("t.node.reports.dlt", b"node-003", "oversize", "5")]
    # The same batch delivered again (a crash before the commit) changes nothing.
    letters.clear()
    await feed.on_reports([], consumed(wire(report("node-001", 6, [MLP1])), wire(newest)))
    assert await served_versions(registry) == {"node-001": {"2"}, "node-002": {"1"}}
    assert letters == []


async def test_the_feed_reads_a_report_only_with_its_nodes_mac(registry: Registry) -> None:
    """A forged report would announce (or take away) a model on a node and steer ML tasks: only
    its node's MAC over its exact bytes lets it reach the registry."""
    letters: list[tuple[bytes | None, str]] = []

    async def publish(topic: str, key: bytes | None, value: bytes,
                      headers: dict[str, str]) -> None:
        letters.append((key, headers["dlt-reason"]))

    master, thief = secrets.token_bytes(32), secrets.token_bytes(32)
    key1, key2 = (enrol_key(master, CLUSTER, n) for n in ("node-001", "node-002"))
    feed = ReportFeed(registry, DeadLetterPolicy("g", publish), 65_536,
                      ReportAuthenticator([master]), require_mac=True)
    changed = signed(report("node-002", 3, [MLP2]), key2)
    await feed.on_reports([], consumed(
        signed(report("node-001", 1, [MLP1]), key1),
        wire(report("node-002", 1, [MLP2])),  # unsigned
        signed(report("node-002", 2, [MLP2]), key1),  # node-001's key, node-002's name
        signed(report("node-002", 2, [MLP2]), enrol_key(thief, CLUSTER, "node-002")),
        (changed[0], changed[1].replace(b'"seq":3', b'"seq":4'), changed[2]),  # changed bytes
        signed(report("node-002", 5, [MLP1]), key2),
    ))
    assert await served_versions(registry) == {"node-001": {"1"}, "node-002": {"1"}}
    assert letters == [(b"node-002", UNAUTHENTICATED)] * 4

    # Migrating from agents that cannot sign: unsigned reports are read, a MAC is still checked.
    letters.clear()
    lenient = ReportFeed(registry, DeadLetterPolicy("g", publish), 65_536,
                         ReportAuthenticator([master]), require_mac=False)
    await lenient.on_reports([], consumed(
        wire(report("node-001", 6, [MLP2])),
        signed(report("node-002", 6, [MLP2]), key1)))
    assert await served_versions(registry) == {"node-001": {"2"}, "node-002": {"1"}}
    assert letters == [(b"node-002", UNAUTHENTICATED)]
