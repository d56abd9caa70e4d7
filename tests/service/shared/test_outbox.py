"""The outbox on a real redis-server: what a script writes with its change is relayed once
its writer is gone, and only then (services/shared/outbox.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import uuid4

from redis.asyncio import Redis

from common.clock import epoch_ms
from schemas.envelope import Envelope
from schemas.events.v1 import NodeState
from schemas.topics import Topic
from services.shared.outbox import OUTBOX_LUA, Outbox, record
from services.shared.redis_client import Keys

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GRACE_S = 30.0

# A state change that announces itself: sets KEYS[3] and writes ARGV[3] to the outbox.
CHANGE = OUTBOX_LUA + """
redis.call('SET', KEYS[3], 'changed')
outbox_append(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
"""


class Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[Topic, Envelope]] = []

    async def publish_many(self, topic: Topic, events: Sequence[Envelope]) -> int:
        self.sent += [(topic, e) for e in events]
        return len(events)


def went_down(node: str) -> NodeState:
    return NodeState(event_id=uuid4(), source="collector", occurred_at=T0, cluster_id="c1",
                     subject=node, node_id=node, pool="default", state="down",
                     previous="suspect", reason="silent", last_report_at=T0)


async def change(redis: Redis, keys: Keys, outbox: Outbox, event: NodeState,
                 at: datetime) -> None:
    script = redis.register_script(CHANGE)
    await script(keys=[*outbox.script_keys, f"{keys.prefix}state:{event.node_id}"],
                 args=[str(event.event_id), epoch_ms(at), record(Topic.OPS_NODE_STATE, event)])


async def test_an_event_its_writer_delivered_is_never_relayed(redis: Redis, keys: Keys) -> None:
    outbox, bus = Outbox(redis, keys, "collector"), Bus()
    event = went_down("n1")
    await change(redis, keys, outbox, event, T0)
    assert await outbox.waiting() == 1
    await outbox.delivered([event.event_id])
    assert await outbox.relay(bus, T0 + timedelta(hours=1), GRACE_S) == 0
    assert bus.sent == []


async def test_what_a_dead_writer_left_is_relayed_once_after_the_grace(
    redis: Redis, keys: Keys
) -> None:
    outbox, bus = Outbox(redis, keys, "collector"), Bus()
    event = went_down("n1")
    await change(redis, keys, outbox, event, T0)
    # Within the grace its writer may still be publishing it.
    assert await outbox.relay(bus, T0 + timedelta(seconds=GRACE_S - 1), GRACE_S) == 0
    assert await outbox.relay(bus, T0 + timedelta(seconds=GRACE_S + 1), GRACE_S) == 1
    assert bus.sent == [(Topic.OPS_NODE_STATE, event)]
    assert await outbox.waiting() == 0
    assert await outbox.relay(bus, T0 + timedelta(hours=1), GRACE_S) == 0
    assert len(bus.sent) == 1


async def test_a_claimed_event_is_left_to_its_relay(redis: Redis, keys: Keys) -> None:
    """A relay that claimed an event and died before publishing it: another relay takes it
    only a grace later, so two live relays never publish it at once."""
    outbox, bus = Outbox(redis, keys, "collector"), Bus()
    event = went_down("n1")
    await change(redis, keys, outbox, event, T0)
    late = T0 + timedelta(seconds=GRACE_S + 1)
    claimed = await outbox._claim(keys=outbox.script_keys,
                                  args=[epoch_ms(late) - int(GRACE_S * 1000),
                                        epoch_ms(late) + int(GRACE_S * 1000), 10])
    assert len(claimed) == 2
    assert await outbox.relay(bus, late + timedelta(seconds=1), GRACE_S) == 0
    assert await outbox.relay(bus, late + timedelta(seconds=2 * GRACE_S + 1), GRACE_S) == 1
    assert bus.sent == [(Topic.OPS_NODE_STATE, event)]


async def test_the_same_change_twice_is_one_event(redis: Redis, keys: Keys) -> None:
    outbox = Outbox(redis, keys, "collector")
    event = went_down("n1")
    await change(redis, keys, outbox, event, T0)
    await change(redis, keys, outbox, event, T0 + timedelta(seconds=5))
    assert await outbox.waiting() == 1
    # It keeps its first time: relayed a grace after the first write.
    assert await outbox.relay(Bus(), T0 + timedelta(seconds=GRACE_S + 1), GRACE_S) == 1


async def test_a_record_that_cannot_be_read_back_is_dropped_not_stuck(
    redis: Redis, keys: Keys
) -> None:
    outbox, bus = Outbox(redis, keys, "collector"), Bus()
    good = went_down("n1")
    await change(redis, keys, outbox, good, T0)
    script = redis.register_script(CHANGE)
    await script(keys=[*outbox.script_keys, f"{keys.prefix}state:n2"],
                 args=["bad", epoch_ms(T0), "ops.node-state.v1\n{not json"])
    assert await outbox.relay(bus, T0 + timedelta(minutes=5), GRACE_S) == 1
    assert bus.sent == [(Topic.OPS_NODE_STATE, good)]
    assert await outbox.waiting() == 0
