"""A service's app on FastStream's in-memory broker, its handlers replaced by spies.

Building an app connects nothing (the Redis and SQL clients connect on first use, topics are
created at start-up, which the in-memory broker does not run), so the real `create_app` is
used: what is tested is the wiring the service runs with. Each handler named in a `Wire` is
swapped, on its class, for a spy with the same signature that records what it is given; every
dead-letter topic of the app gets a sink.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import pytest
from faststream import FastStream
from faststream.kafka import KafkaBroker, KafkaMessage, TestKafkaBroker
from faststream.kafka.subscriber.usecase import BatchSubscriber, LogicSubscriber

from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Envelope
from schemas.topics import Topic, dead_letter_name, topic_name
from tests.contracts.examples import examples

NAMESPACE = "wiring"


@dataclass(frozen=True)
class Wire:
    """One subscription as the service is meant to have it."""

    topic: Topic
    group: str  # the consumer group, namespaced
    owner: type  # the class whose method handles the topic
    method: str
    limit: int | None = None  # the size limit; None: the settings' max_message_bytes
    batch: bool = False  # raw bodies in batches, validated by the handler
    sealed: bool = False  # read only with the MAC of the node the message names

    @property
    def handler(self) -> str:
        return f"{self.owner.__name__}.{self.method}"

    @property
    def wire_name(self) -> str:
        return topic_name(self.topic, NAMESPACE)


@dataclass
class Recorder:
    """What each spied handler was given (its first argument), in order."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    dead: dict[str, list[tuple[dict[str, str], bytes]]] = field(default_factory=dict)

    def spy(self, monkeypatch: pytest.MonkeyPatch, wire: Wire) -> None:
        original = getattr(wire.owner, wire.method)
        signature = inspect.signature(original, eval_str=True)
        first = list(signature.parameters)[1]  # after self
        name = wire.handler

        async def spy(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, signature.bind(*args, **kwargs).arguments[first]))

        # The original's resolved signature, so FastStream injects what it would inject.
        spy.__signature__ = signature  # type: ignore[attr-defined]
        spy.__annotations__ = get_type_hints(original)
        spy.__name__, spy.__qualname__ = original.__name__, original.__qualname__
        monkeypatch.setattr(wire.owner, wire.method, spy)

    def sink(self, broker: KafkaBroker, wire_name: str) -> None:
        """Record every dead letter of `wire_name` as (headers, body)."""
        letters = self.dead.setdefault(wire_name, [])

        async def receive(body: Any, msg: KafkaMessage) -> None:
            letters.append((dict(msg.headers), msg.body))

        broker.subscriber(dead_letter_name(wire_name))(receive)


@asynccontextmanager
async def running(monkeypatch: pytest.MonkeyPatch, create: Callable[[], FastStream],
                  wires: Sequence[Wire]) -> AsyncIterator[tuple[KafkaBroker, Recorder]]:
    """The app `create` makes, with spies and dead-letter sinks, on the in-memory broker."""
    recorder = Recorder()
    for wire in wires:
        recorder.spy(monkeypatch, wire)
    broker = create().broker
    assert isinstance(broker, KafkaBroker)
    for wire in wires:
        recorder.sink(broker, wire.wire_name)
    async with TestKafkaBroker(broker):
        yield broker, recorder


def example_of(topic: Topic) -> Envelope:
    """A realistic event of the topic's model (the contract tests' examples)."""
    model = TOPIC_MODELS[topic]
    return next(event for event in examples().values() if type(event) is model)


def subscriptions(broker: KafkaBroker) -> set[tuple[str, str, bool]]:
    """(topic, consumer group, batch?) of every subscription but the dead-letter sinks."""
    found = set()
    for sub in broker.subscribers:
        assert isinstance(sub, LogicSubscriber)
        for name in sub.topic_names_for_subscribe:
            if not name.endswith(".dlt"):
                found.add((name, sub.group_id or "", isinstance(sub, BatchSubscriber)))
    return found
