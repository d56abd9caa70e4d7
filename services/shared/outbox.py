"""A transactional outbox in Redis: a state change and the event that announces it are one unit.

A service that changes state in Redis and then publishes the event loses the event if it dies
in between: a need marked open that no task ever follows, a node marked `down` that nobody
hears of, a task final in its journal whose parent waits for ever. So the Lua script that makes
the change also writes the event into its service's outbox (`OUTBOX_LUA`'s `outbox_append`,
prepended to that script, with the outbox's two keys among the script's keys). The service
then publishes as before and removes what the broker acknowledged (`Outbox.delivered`); what a
dead process left behind, the relay of any instance publishes once it is older than a grace
period (`Outbox.relay`, run as a loop).

An event may so go out twice: the process died after the broker's acknowledgement and before
`delivered`, or a publish outlasted the grace. Every event keeps its id across both, and the
consumers are idempotent on it (the templater derives its task id from the need's id, the task
store and the analyzer ignore a transition they have seen), so twice is harmless where lost is
not. docs/reliability.md lists the crash tests (S2, S23, S24).

A record keeps the trace context it was written in (common/tracing.py), and the relay
publishes each event in a span of that trace: an event a dead process left behind still
belongs to the report (or sweep) that caused it, not to the relay's tick.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol

from opentelemetry import trace
from pydantic import ValidationError
from redis.asyncio import Redis

from common.clock import epoch_ms
from common.settings import ServiceSettings
from common.tracing import current_trace, resumed_span
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Envelope
from schemas.topics import Topic
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.outbox")

# Prepended to a script that changes state: `outbox_append(due, events, id, at_ms, record)`
# writes one event beside the change, in the same atomic call. An id already waiting keeps
# its first record and time (the same change made twice is one event).
OUTBOX_LUA = """
local function outbox_append(due, events, id, at_ms, record)
  if redis.call('HSETNX', events, id, record) == 1 then
    redis.call('ZADD', due, at_ms, id)
  end
end
"""

# Takes up to ARGV[3] events waiting since before ARGV[1] (epoch ms) and moves each one's time
# to ARGV[2], so a second relay leaves them alone while this one publishes them. KEYS[1] the
# outbox, KEYS[2] its events. Returns id, record, id, record, ...
CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local record = redis.call('HGET', KEYS[2], id)
  if record then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    out[#out + 1] = id
    out[#out + 1] = record
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
"""

# Between the topic, the event's JSON and its packed trace context: none of them holds a
# newline (the JSON is compact, a W3C context has none).
SEPARATOR = "\n"
_tracer = trace.get_tracer("clusterwarden.outbox")


class BatchPublisher(Protocol):
    """What the relay publishes through (common.messaging.EventBus)."""

    async def publish_many(self, topic: Topic, events: Sequence[Envelope]) -> int: ...


def record(topic: Topic, event: Envelope, trace_context: str | None = None) -> str:
    """An event as its outbox keeps it: the topic, the exact JSON to publish, then the trace
    context it belongs to (`trace_context`, packed; by default the current span's)."""
    packed = current_trace() if trace_context is None else trace_context
    tail = f"{SEPARATOR}{packed}" if packed else ""
    return f"{topic.value}{SEPARATOR}{event.model_dump_json()}{tail}"


class Recorded(NamedTuple):
    """An outbox record read back."""

    topic: Topic
    event: Envelope
    trace_context: str  # packed; '' for a record written without one


def outbox_period_s(settings: ServiceSettings) -> float:
    """How often a service's relay looks for events left behind: a few times a grace."""
    return max(0.5, settings.outbox_grace_s / 4)


class Outbox:
    """One service's outbox: the events its scripts wrote and the broker has not yet taken."""

    def __init__(self, redis: Redis, keys: Keys, owner: str) -> None:
        self.redis = redis
        self.due_key = keys.outbox(owner)
        self.events_key = keys.outbox_events(owner)
        self._claim = redis.register_script(CLAIM)

    @property
    def script_keys(self) -> list[str]:
        """The two keys a script that calls `outbox_append` takes (due, events)."""
        return [self.due_key, self.events_key]

    async def delivered(self, event_ids: Iterable[object]) -> None:
        """Forget events the broker acknowledged."""
        ids = [str(event_id) for event_id in event_ids]
        if not ids:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.due_key, *ids)
            pipe.hdel(self.events_key, *ids)
            await pipe.execute()

    async def waiting(self) -> int:
        """How many events wait (for tests and the health of the relay)."""
        return int(await self.redis.zcard(self.due_key))

    async def relay(self, bus: BatchPublisher, now: datetime, grace_s: float,
                    limit: int = 500) -> int:
        """Publish the events older than `grace_s` (their writer died, or outlasted the grace),
        then forget them; returns how many went out."""
        now_ms = epoch_ms(now)
        flat = await self._claim(keys=self.script_keys,
                                 args=[now_ms - int(grace_s * 1000),
                                       now_ms + int(grace_s * 1000), limit])
        by_topic: dict[Topic, list[Recorded]] = defaultdict(list)
        unreadable: list[str] = []
        for raw_id, raw in zip(flat[::2], flat[1::2], strict=True):
            event_id = text(raw_id)
            event = parse_record(text(raw))
            if event is None:
                log.error("outbox event %s is unreadable and dropped: %.200s", event_id,
                          text(raw))
                unreadable.append(event_id)
                continue
            by_topic[event.topic].append(event)
        sent: list[str] = []
        for topic, events in by_topic.items():
            # One at a time, each in its own trace: relaying is the rare path (a writer died).
            for recorded in events:
                with resumed_span(_tracer, "outbox.relay", recorded.trace_context,
                                  attributes={"messaging.destination.name": topic.value}):
                    await bus.publish_many(topic, [recorded.event])
                sent.append(str(recorded.event.event_id))
            log.warning("relayed %d %s event(s) a process left unpublished", len(events),
                        topic.value)
        await self.delivered([*sent, *unreadable])
        return len(sent)


def parse_record(raw: str) -> Recorded | None:
    """The topic, event and trace context of an outbox record, or None if it cannot be read
    back (only a record written by an incompatible version could be). A record written
    before records kept their trace context has none."""
    name, _, rest = raw.partition(SEPARATOR)
    body, _, packed = rest.partition(SEPARATOR)
    try:
        topic = Topic(name)
        return Recorded(topic, TOPIC_MODELS[topic].model_validate_json(body), packed)
    except (ValueError, KeyError, ValidationError):
        return None

