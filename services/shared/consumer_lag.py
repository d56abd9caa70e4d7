"""How far each consumer group of a service is behind its topics, sampled from its own
consumers: a partition's lag is its high watermark (as the last fetch saw it) minus the
consumer's position, so a sample asks the broker nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, Final

from aiokafka.errors import IllegalStateError
from faststream.kafka import KafkaBroker

from common.metrics import CONSUMER_LAG, Gauge, Instruments, instruments

log = logging.getLogger("clusterwarden.consumer_lag")

# A position is local unless the consumer must first look it up (just assigned): then the
# next sample has it.
POSITION_TIMEOUT_S: Final = 1.0

Key = tuple[str, str]  # (consumer group, topic)


class ConsumerLag:
    """Sets `warden.consumer.lag` per (group, topic) of the broker's subscribers."""

    def __init__(self, broker: KafkaBroker, recorded: Instruments | None = None) -> None:
        self._broker = broker
        self._gauge: Gauge = (recorded or instruments()).gauge(CONSUMER_LAG)
        self._seen: set[Key] = set()

    async def sample(self) -> None:
        lags: dict[Key, int] = {}
        for group, consumer in _consumers(self._broker):
            for tp in list(consumer.assignment()):
                lag = await _lag(consumer, tp)
                key = (group, str(tp.topic))
                lags[key] = lags.get(key, 0) + (lag or 0)
        # A group whose partitions went elsewhere (a rebalance) lags nothing here any more:
        # 0, not the last value it had.
        for key in self._seen - lags.keys():
            lags[key] = 0
        self._seen = set(lags)
        for (group, topic), lag in lags.items():
            self._gauge.set(lag, {"consumer_group": group, "topic": topic})


def _consumers(broker: KafkaBroker) -> Iterable[tuple[str, Any]]:
    """(group, aiokafka consumer) of every started subscriber (a concurrent one has several)."""
    for subscriber in broker.subscribers:
        group = getattr(subscriber, "group_id", None)
        if not group:
            continue
        consumers = getattr(subscriber, "consumer_subgroup", None) or [
            getattr(subscriber, "consumer", None)]
        for consumer in consumers:
            if consumer is not None:
                yield str(group), consumer


async def _lag(consumer: Any, tp: Any) -> int | None:
    """The partition's lag, or None while its high watermark or position is not known."""
    high = consumer.highwater(tp)
    if high is None:
        return None
    try:
        async with asyncio.timeout(POSITION_TIMEOUT_S):
            position = int(await consumer.position(tp))
    except (TimeoutError, IllegalStateError) as err:  # revoked meanwhile: no longer ours
        log.debug("no position for %s: %r", tp, err)
        return None
    return max(0, int(high) - position)
