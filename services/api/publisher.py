"""The API's Kafka side: control events and alerts, through the services' own broker settings.

The broker is started on first use, not with the API: reads (tasks, nodes, templates) must
keep working while Kafka is down, and a control that cannot be published is answered 503
within `publish_timeout_s` instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from faststream.kafka import KafkaBroker

from common.kafka_access import client_options
from common.messaging import EventBus, make_broker
from common.settings import ServiceSettings
from common.telemetry import Telemetry
from schemas.envelope import Envelope
from schemas.topics import PARTITIONS, Topic, topic_name

log = logging.getLogger("clusterwarden.api")
# What the API publishes: operators' controls, the alert announcing a breaker reset, ML
# task submissions, the needs of a node's rotation, and template changes.
PUBLISHED: tuple[Topic, ...] = (Topic.OPS_TASK_CONTROL, Topic.OPS_ALERTS,
                                Topic.ML_TASKS_SUBMITTED, Topic.OPS_NEEDS,
                                Topic.OPS_TEMPLATE_CHANGES)


class PublishFailed(Exception):
    """The event could not be published (Kafka unreachable or too slow)."""


class Publisher:
    """Publishes events with an idempotent producer started on first use."""

    def __init__(self, settings: ServiceSettings, telemetry: Telemetry,
                 timeout_s: float) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.timeout_s = timeout_s
        self._broker: KafkaBroker | None = None
        self._lock = asyncio.Lock()

    async def _bus(self) -> EventBus:
        async with self._lock:
            if self._broker is None:
                await self._ensure_topics()
                broker, _ = make_broker(self.settings, "api", self.telemetry)
                try:
                    await broker.start()
                except BaseException:
                    await broker.stop()
                    raise
                self._broker = broker
            return EventBus(self._broker, self.settings.namespace)

    async def _ensure_topics(self) -> None:
        """Create the topics the API publishes to, if missing (brokers do not auto-create).

        Any service creates every topic when it starts; the API creates only its own, so a
        deployment whose API starts first still takes a control, at little cost.
        """
        wanted = {topic_name(t, self.settings.namespace): PARTITIONS[t] for t in PUBLISHED}
        admin = AIOKafkaAdminClient(**client_options(self.settings),
                                    request_timeout_ms=int(self.timeout_s * 1000))
        try:
            await admin.start()
            missing = [NewTopic(name, num_partitions=parts, replication_factor=1)
                       for name, parts in wanted.items()
                       if name not in set(await admin.list_topics())]
            if not missing:
                return
            with contextlib.suppress(TopicAlreadyExistsError):  # another process was first
                await admin.create_topics(missing)
            # A new partition refuses produce requests until its leader is elected.
            while True:
                described = await admin.describe_topics([t.name for t in missing])
                if all(d["error_code"] == 0 and d["partitions"]
                       and all(p["leader"] >= 0 for p in d["partitions"]) for d in described):
                    return
                await asyncio.sleep(0.2)
        finally:
            await admin.close()

    async def publish(self, topic: Topic, event: Envelope) -> None:
        """Publish and wait for the broker's acknowledgement; raises PublishFailed."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await (await self._bus()).publish(topic, event)
        except Exception as err:
            log.warning("publish on %s failed: %r", topic, err)
            raise PublishFailed(f"Kafka did not acknowledge the event: {err!r}") from err

    async def close(self) -> None:
        async with self._lock:
            if self._broker is not None:
                await self._broker.stop()
                self._broker = None
