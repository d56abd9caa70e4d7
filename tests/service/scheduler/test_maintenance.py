"""Maintenance windows hold the scheduler's tasks (real redis-server; the bus only records):
a cluster's window holds every task of the cluster, a node's window the tasks touching the
node, each hold is announced once in the task's transitions, and the task is dispatched once
the window ends. A rotation's own tasks pass its node's window."""

from __future__ import annotations

from datetime import datetime

from redis.asyncio import Redis

from schemas.events.v1 import Evidence, OpsTask, TaskEvent, TaskScheduled
from schemas.topics import Topic
from services.shared.maintenance import (
    ROTATION_METRIC,
    MaintenanceStore,
    new_window,
    rotation_need,
)
from services.shared.redis_client import Keys
from tests.service.scheduler.helpers import Clock, RecordingBus, task
from tests.service.scheduler.test_limits import bus, dispatched, queue, scheduler


def held(s_bus: RecordingBus, t: OpsTask) -> list[TaskEvent]:
    return [e for e in s_bus.on(Topic.OPS_TASK_EVENTS) if isinstance(e, TaskEvent)
            and e.task_id == t.task_id and e.reason.startswith("held:")]


async def test_a_node_window_holds_its_tasks_until_it_ends(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    store = MaintenanceStore(redis, keys)
    s = scheduler(redis, keys, clock)
    s.maintenance = store
    window = new_window("local", "node-1", "alice", "new PSU", clock.utc())
    assert await store.start(window) is None
    again = await store.start(new_window("local", "node-1", "bob", "again", clock.utc()))
    assert again == window  # one window per scope: the first stays
    on_node, elsewhere = task("node-1"), task("node-2")
    await queue(s, on_node, elsewhere)
    await s.dispatch()
    await s.dispatch()
    assert dispatched(s) == ["node-2"]
    [hold] = held(bus(s), on_node)  # announced once, however many ticks hold it
    assert (hold.state, hold.previous_state) == ("queued", "queued")
    assert hold.reason == "held: maintenance of node node-1 by alice: new PSU"
    assert await store.end("local", "node-1") == window
    assert await store.end("local", "node-1") is None
    await s.dispatch()
    assert dispatched(s) == ["node-2", "node-1"]


async def test_a_cluster_window_holds_every_task_of_the_cluster(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    store = MaintenanceStore(redis, keys)
    s = scheduler(redis, keys, clock)
    s.maintenance = store
    await store.start(new_window("local", None, "alice", "network upgrade", clock.utc()))
    first, second = task("node-1"), task("node-2")
    await queue(s, first, second)
    await s.dispatch()
    assert dispatched(s) == []
    for t in (first, second):
        assert held(bus(s), t)[0].reason == ("held: maintenance of cluster local by alice: "
                                             "network upgrade")
    assert list(await store.windows("local")) == ["*"]
    await store.end("local", None)
    await s.dispatch()
    assert sorted(dispatched(s)) == ["node-1", "node-2"]


async def test_a_rotation_passes_its_own_tasks_only(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    store = MaintenanceStore(redis, keys)
    s = scheduler(redis, keys, clock)
    s.maintenance = store
    window = new_window("local", "node-1", "alice", "swap GPU 3", clock.utc(), "rotation")
    await store.start(window)
    need = rotation_need(window, "offline", "default", "api", clock.utc())
    assert (need.kind, need.target, need.evidence[0].metric) == ("offline", "node-1",
                                                                 ROTATION_METRIC)
    own = task("node-1").model_copy(update={"evidence": list(need.evidence)})
    fault = Evidence(metric="node_fault_count", value=1.0, range_low=0.0, range_high=0.0,
                     observed_at=datetime.now().astimezone())
    stranger = task("node-1").model_copy(update={"mutex_keys": ["node.node-1.b"],
                                                 "evidence": [fault]})
    await queue(s, stranger, own)
    await s.dispatch()
    assert [e.task.task_id for e in bus(s).on(Topic.OPS_TASKS_SCHEDULED)
            if isinstance(e, TaskScheduled)] == [own.task_id]
    assert held(bus(s), stranger)[0].reason.startswith("held: rotation of node node-1")
