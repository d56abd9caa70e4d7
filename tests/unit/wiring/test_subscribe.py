"""`subscribe`: the model comes from the topic, and a handler that takes another is refused."""

from __future__ import annotations

import pytest
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker

from common.messaging import subscribe
from common.settings import ServiceSettings
from schemas.events.v1 import OpsNeed, TaskEvent
from schemas.topics import Topic
from tests.unit.wiring.harness import example_of, subscriptions

SETTINGS = ServiceSettings(namespace="ns")


async def test_the_handler_gets_the_topics_model_from_the_namespaced_topic() -> None:
    broker = KafkaBroker()
    got: list[OpsNeed] = []

    async def on_need(need: OpsNeed) -> None:
        got.append(need)

    subscribe(broker, SETTINGS, Topic.OPS_NEEDS, "templater", on_need)
    assert subscriptions(broker) == {("ns.ops.needs.v1", "ns.templater", False)}
    need = example_of(Topic.OPS_NEEDS)
    async with TestKafkaBroker(broker):
        await broker.publish(need.model_dump_json().encode(), topic="ns.ops.needs.v1",
                             key=need.subject.encode())
    assert got == [need]


async def test_a_batch_handler_gets_the_raw_bodies() -> None:
    broker = KafkaBroker()
    got: list[list[bytes]] = []

    async def on_reports(bodies: list[bytes], msg: KafkaMessage) -> None:
        got.append(bodies)

    subscribe(broker, SETTINGS, Topic.NODE_REPORTS, "collector", on_reports, batch_records=10)
    assert subscriptions(broker) == {("ns.node.reports.v1", "ns.collector", True)}
    async with TestKafkaBroker(broker):
        await broker.publish(b"not even json", topic="ns.node.reports.v1")
    assert got == [[b"not even json"]]


def test_a_handler_taking_another_model_is_refused_at_wiring_time() -> None:
    async def on_event(event: TaskEvent) -> None:
        pass

    with pytest.raises(TypeError, match=r"must take OpsNeed first: ops\.needs\.v1"):
        subscribe(KafkaBroker(), SETTINGS, Topic.OPS_NEEDS, "templater", on_event)


def test_an_unannotated_or_batch_mismatched_handler_is_refused() -> None:
    async def bare(need) -> None:  # type: ignore[no-untyped-def]
        pass

    async def one(need: OpsNeed) -> None:
        pass

    with pytest.raises(TypeError, match="must take OpsNeed"):
        subscribe(KafkaBroker(), SETTINGS, Topic.OPS_NEEDS, "templater", bare)
    with pytest.raises(TypeError, match=r"must take list\[bytes\]"):
        subscribe(KafkaBroker(), SETTINGS, Topic.OPS_NEEDS, "templater", one, batch_records=5)
