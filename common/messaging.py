"""The broker factory and the safe messaging defaults every service uses.

* Producers are idempotent (`enable_idempotence=True`, which implies `acks=all`); aiokafka's
  defaults are `acks=1` without idempotence.
* Consumers start from the earliest offset (the aiokafka default `latest` makes a new group
  skip history) and commit only after processing (`AckPolicy.NACK_ON_ERROR`), with the
  dead-letter middleware deciding what a failure means.
* Every message is validated strictly from its bytes (`model_validate_json`), after a size
  check, ignoring the producer's content-type; the Kafka key must equal the event subject.
* Topics are created explicitly (brokers run with auto-creation off).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, get_type_hints

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError
from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware
from faststream.message import StreamMessage
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from common.deadletter import DeadLetterPolicy
from common.errors import PermanentError
from common.kafka_access import broker_security
from common.settings import ServiceSettings
from common.telemetry import Telemetry
from common.tracing import TRACEPARENT
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Envelope
from schemas.topics import PARTITIONS, Topic, dead_letter_name, topic_name

if TYPE_CHECKING:
    from common.reportauth import NodeSeal

log = logging.getLogger("clusterwarden.messaging")

E = TypeVar("E", bound=Envelope)


def consumer_options(group: str) -> dict[str, Any]:
    """Subscriber keyword arguments for at-least-once processing in consumer group `group`."""
    return {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "ack_policy": AckPolicy.NACK_ON_ERROR,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 3_000,
    }


def check_size(body: bytes, limit: int) -> None:
    """Reject a message before parsing if it is larger than `limit` bytes."""
    if len(body) > limit:
        raise PermanentError("oversize", f"{len(body)} bytes > limit {limit}")


def parse_event(model: type[E], body: bytes, key: bytes | None, limit: int) -> E:
    """Validate one message strictly; raises PermanentError (or ValidationError) if it is bad."""
    check_size(body, limit)
    try:
        event = model.model_validate_json(body)
    except RecursionError as err:  # pydantic reports deep nesting itself; belt and braces
        raise PermanentError("json_invalid", "nesting too deep") from err
    # Every ClusterWarden producer keys by subject; a keyless message would skip the check that
    # ties a partition's messages to the subject they claim, so it is refused, not waved through.
    if not key:  # None, or empty (as some clients send "no key")
        raise PermanentError("key_missing", f"no message key (subject {event.subject!r})")
    if key.decode("utf-8", "replace") != event.subject:
        raise PermanentError("key_mismatch", f"key {key!r} != subject {event.subject!r}")
    return event


def strict_decoder(model: type[E], limit: int,
                   seal: NodeSeal | None = None) -> Callable[[StreamMessage[Any]], Awaitable[E]]:
    """A FastStream decoder that turns the raw bytes into `model`, or raises; with `seal`, the
    message must also carry the MAC of the node it names (PermanentError `seal.reason`)."""

    async def decode(msg: StreamMessage[Any]) -> E:
        raw = msg.raw_message
        key = getattr(raw, "key", None)
        event = parse_event(model, msg.body, key, limit)
        if seal is not None:
            refusal = seal.refusal(event.cluster_id, getattr(event, "node_id", event.subject),
                                   msg.body, getattr(raw, "headers", None) or ())
            if refusal is not None:
                raise PermanentError(seal.reason, refusal)
        return event

    return decode


class EventBus:
    """Publishes events as strict JSON on namespaced topics, keyed by subject."""

    def __init__(self, broker: KafkaBroker, namespace: str) -> None:
        self.broker = broker
        self.namespace = namespace

    def name(self, topic: Topic) -> str:
        return topic_name(topic, self.namespace)

    async def publish(self, topic: Topic, event: Envelope) -> None:
        """Publish and wait for the broker's acknowledgement."""
        await self.publish_sealed(topic, event, None)

    async def publish_sealed(self, topic: Topic, event: Envelope,
                             seal: Callable[[bytes], Mapping[str, str]] | None) -> None:
        """Publish with the headers `seal` gives for the exact bytes sent (a node's report
        MAC, common/reportauth.py), and wait for the broker's acknowledgement."""
        body = event.model_dump_json().encode()
        headers = _headers(event)
        if seal is not None:
            headers |= seal(body)
        await self.broker.publish(body, topic=self.name(topic), key=event.subject.encode(),
                                  headers=headers)

    async def publish_many(self, topic: Topic, events: Iterable[Envelope]) -> int:
        """Publish many events pipelined (the producer batches them), then await every ack."""
        pending = [
            await self.broker.publish(
                event.model_dump_json().encode(),
                topic=self.name(topic),
                key=event.subject.encode(),
                headers=_headers(event),
                no_confirm=True,
            )
            for event in events
        ]
        await asyncio.gather(*pending)
        return len(pending)


class BulkPublisher:
    """Publishes many events straight through an idempotent aiokafka producer.

    For the high-volume path (a sample per report, 5,000/s): FastStream's publish wraps every
    message in middlewares and a span, about three times the cost of a plain producer send.
    Here one span covers the whole batch and its W3C trace context goes into every message's
    headers, so consumers still continue the trace.
    """

    def __init__(self, client: Mapping[str, Any], namespace: str, client_id: str,
                 tracer: trace.Tracer) -> None:
        """`client`: the connection's options (`common.kafka_access.client_options`)."""
        self.namespace = namespace
        self.tracer = tracer
        self._options: dict[str, Any] = {
            **client, "client_id": client_id, "enable_idempotence": True,
            "acks": "all", "linger_ms": 5, "request_timeout_ms": 15_000,
        }
        self._producer: AIOKafkaProducer | None = None
        self._propagator = TraceContextTextMapPropagator()

    async def start(self) -> None:
        # Made here, not in __init__: an aiokafka producer must be created inside the loop.
        self._producer = AIOKafkaProducer(**self._options)
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("BulkPublisher.start() was not awaited")
        return self._producer

    async def publish_many(self, topic: Topic, events: Sequence[Envelope],
                           headers: Sequence[Mapping[str, str]] | None = None) -> int:
        """Send every event (pipelined), then await every acknowledgement.

        `headers`, one mapping per event, is added to each event's own; a `traceparent` among
        them puts that event in its own trace (the report a sample or a state change came
        from) instead of the batch span's."""
        if not events:
            return 0
        wire = topic_name(topic, self.namespace)
        with self.tracer.start_as_current_span(
            f"{wire} publish", kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.system": "kafka", "messaging.destination.name": wire,
                        "messaging.batch.message_count": len(events)},
        ):
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            pending = [
                await self.producer.send(
                    wire,
                    event.model_dump_json().encode(),
                    key=event.subject.encode(),
                    headers=[(k, v.encode()) for k, v in _event_headers(
                        event, carrier, headers[i] if headers else {}).items()],
                )
                for i, event in enumerate(events)
            ]
            await asyncio.gather(*pending)
        return len(pending)


def _headers(event: Envelope) -> dict[str, str]:
    return {"content-type": "application/json", "event-type": event.event_type}


def _event_headers(event: Envelope, batch_context: Mapping[str, str],
                   own: Mapping[str, str]) -> dict[str, str]:
    """One event's headers in a bulk send: the batch span's context unless `own` names the
    event's own trace, then the event's type and `own`."""
    context = {} if TRACEPARENT in own else dict(batch_context)
    return {**context, **_headers(event), **own}


def make_broker(
    settings: ServiceSettings, service: str, telemetry: Telemetry
) -> tuple[KafkaBroker, DeadLetterPolicy]:
    """A Kafka broker with idempotent producers, tracing and the dead-letter middleware."""
    holder: dict[str, KafkaBroker] = {}

    async def publish_dead_letter(topic: str, key: bytes | None, value: bytes,
                                  headers: dict[str, str]) -> None:
        await holder["broker"].publish(value, topic=topic, key=key, headers=headers)

    policy = DeadLetterPolicy(group=group_name(settings, service), publish=publish_dead_letter)
    broker = KafkaBroker(
        settings.kafka_bootstrap_servers,
        client_id=f"warden-{service}",
        security=broker_security(settings),
        enable_idempotence=True,
        acks="all",
        allow_auto_create_topics=False,
        request_timeout_ms=15_000,
        graceful_timeout=10.0,
        middlewares=[
            KafkaTelemetryMiddleware(
                tracer_provider=telemetry.tracer_provider,
                meter_provider=telemetry.meter_provider,
            ),
            policy,
        ],
    )
    holder["broker"] = broker
    return broker, policy


def group_name(settings: ServiceSettings, service: str) -> str:
    """The consumer group of a service (namespaced, so test runs never share offsets)."""
    return f"{settings.namespace}.{service}" if settings.namespace else f"warden.{service}"


def all_topic_names(namespace: str) -> dict[str, int]:
    """Every topic of the loop and its dead-letter topic, with partition counts."""
    names: dict[str, int] = {}
    for topic in Topic:
        wire = topic_name(topic, namespace)
        names[wire] = PARTITIONS[topic]
        names[dead_letter_name(wire)] = 1
    return names


def _admin(bootstrap: str, security: Mapping[str, Any] | None) -> AIOKafkaAdminClient:
    options = {**(security or {}), "bootstrap_servers": bootstrap}
    return AIOKafkaAdminClient(**options, request_timeout_ms=10_000)


def _created(response: Any) -> list[str]:
    """The topics a create request made. On a secured broker a principal may create none:
    the setup step made them all (docs/security.md), and it cannot even see the topics it
    has no rights on, so those come back refused and are left alone."""
    made = []
    for topic, code, *_ in response.topic_errors:
        if code == TopicAuthorizationFailedError.errno:
            continue
        made.append(topic)
    return made


async def _wait_for_leaders(admin: AIOKafkaAdminClient, names: list[str],
                            timeout_s: float = 30.0) -> None:
    """Wait until every partition of new topics has a leader, so first reads do not fail."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(names)
        if all(t["error_code"] == 0 and t["partitions"]
               and all(p["leader"] >= 0 for p in t["partitions"]) for t in described):
            return
        await asyncio.sleep(0.2)


async def delete_topics(bootstrap: str, namespace: str,
                        security: Mapping[str, Any] | None = None) -> None:
    """Delete every topic of `namespace` (a finished test run's): a broker holding thousands of
    idle partitions spends its heap and its controller's time on them."""
    if not namespace:
        raise ValueError("refusing to delete the production (un-namespaced) topics")
    admin = _admin(bootstrap, security)
    try:
        await admin.start()
        prefix = f"{namespace}."
        doomed = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


async def ensure_topics(bootstrap: str, namespace: str, attempts: int = 30,
                        security: Mapping[str, Any] | None = None) -> None:
    """Create every topic of `namespace` if missing (idempotent; retries while Kafka starts).

    `security`: the connection's options (`common.kafka_access.client_options`).
    """
    wanted = all_topic_names(namespace)
    for attempt in range(attempts):
        admin = _admin(bootstrap, security)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [
                NewTopic(name, num_partitions=parts, replication_factor=1)
                for name, parts in wanted.items()
                if name not in existing
            ]
            if missing:
                # Another service may have created them first.
                with contextlib.suppress(TopicAlreadyExistsError):
                    made = _created(await admin.create_topics(missing))
                    if made:
                        await _wait_for_leaders(admin, made)
            return
        except Exception as err:
            if attempt == attempts - 1:
                raise
            log.info("waiting for Kafka to create topics: %r", err)
            await asyncio.sleep(1.0)
        finally:
            await admin.close()


async def raw_bodies(msg: StreamMessage[Any]) -> Any:
    """A batch subscriber's decoder that leaves the bytes alone, so each record of the batch
    is validated (and dead-lettered) on its own instead of failing the whole batch."""
    return msg.body


def subscribe(
    broker: KafkaBroker,
    settings: ServiceSettings,
    topic: Topic,
    group: str,
    handler: Callable[..., Awaitable[None]],
    *,
    limit: int | None = None,
    batch_records: int | None = None,
    seal: NodeSeal | None = None,
) -> None:
    """Subscribe `handler` to `topic` in the service's consumer group `group` (namespaced).

    Every message is validated strictly as the topic's model in the catalogue
    (`schemas.catalog.TOPIC_MODELS`), at most `limit` bytes (default: the settings' limit),
    and the handler's first parameter must be annotated with that model: a handler wired to
    the wrong topic fails here, at wiring time. With `batch_records`, the handler takes up to
    that many raw bodies at once (`list[bytes]`) and validates each record itself, so one bad
    record is dead-lettered alone. With `seal`, a message must carry the MAC of the node it
    names (common/reportauth.py), else it is dead-lettered with the seal's reason. The handler
    is subscribed as it is, so its name and docstring still name the channel in the AsyncAPI
    document.
    """
    name = topic_name(topic, settings.namespace)
    options = consumer_options(group_name(settings, group))
    if batch_records is not None:
        _check_payload(handler, topic, list[bytes])
        broker.subscriber(name, batch=True, max_records=batch_records, decoder=raw_bodies,
                          **options)(handler)
        return
    model = TOPIC_MODELS[topic]
    _check_payload(handler, topic, model)
    size = settings.max_message_bytes if limit is None else limit
    broker.subscriber(name, decoder=strict_decoder(model, size, seal), **options)(handler)


def _check_payload(handler: Callable[..., Awaitable[None]], topic: Topic, payload: object) -> None:
    """Raise TypeError unless the handler's first parameter is annotated `payload`."""
    first = next(iter(inspect.signature(handler).parameters), None)
    declared = get_type_hints(handler).get(first) if first is not None else None
    if declared != payload:
        what = payload.__name__ if isinstance(payload, type) else str(payload)
        raise TypeError(f"{getattr(handler, '__qualname__', handler)!r} must take {what} "
                        f"first: {topic.value} carries it (it takes {declared!r})")
