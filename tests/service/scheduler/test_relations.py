"""The relation gate on a real redis-server (the bus only records): the concurrency semaphore,
a hold announced once per blocker, depends_on failing its dependent, and two schedulers that
cannot both admit conflicting tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from schemas.events.v1 import Dependency, ExclusiveWith, OpsTask, TaskEvent, TaskRelations
from schemas.topics import Topic
from services.scheduler.handlers import Scheduler
from services.scheduler.relation_gate import RelationGate
from services.scheduler.relations_store import RelationStore
from services.shared.locks import Semaphore
from services.shared.redis_client import Keys
from tests.service.scheduler.helpers import Clock, final_event, task
from tests.service.scheduler.test_limits import bus, dispatched, queue, scheduler


def related(target: str, template: str = "drain", pool: str = "default",
            **relations: Any) -> OpsTask:
    made = task(target, pool=pool)
    # A lock of its own, so only the relations can hold two tasks of one target apart.
    return made.model_copy(update={"mutex_keys": [f"own.{made.task_id}"],
                                   "relations": TaskRelations(template=template, **relations)})


def gated(redis: Redis, keys: Keys, clock: Clock) -> Scheduler:
    return scheduler(redis, keys, clock, relations=True)


def transitions(s: Scheduler, t: OpsTask) -> list[TaskEvent]:
    return [e for e in bus(s).on(Topic.OPS_TASK_EVENTS) if isinstance(e, TaskEvent)
            and e.task_id == t.task_id]


def holds(s: Scheduler, t: OpsTask) -> list[str]:
    return [e.reason for e in transitions(s, t) if e.reason.startswith("held:")]


async def finish(s: Scheduler, t: OpsTask, state: str = "succeeded") -> None:
    await s.on_task_event(final_event(t.task_id, state, at=s.clock()))  # type: ignore[arg-type]


async def test_the_semaphore_counts_places_not_targets(redis: Redis, keys: Keys) -> None:
    sem = Semaphore(redis, keys)
    # Any two targets take the two places: nothing hashes them onto one.
    assert (await sem.take("offline", "local", "a", 2, 0, 1_000)).taken
    assert (await sem.take("offline", "local", "b", 2, 0, 1_000)).taken
    third = await sem.take("offline", "local", "c", 2, 0, 1_000)
    assert (third.taken, third.held) == (False, 2)
    # A holder asking again keeps its place; another cluster has places of its own.
    assert (await sem.take("offline", "local", "a", 2, 0, 1_000)).taken
    assert (await sem.take("offline", "east", "c", 2, 0, 1_000)).taken
    await sem.release("offline", "local", "a")
    await sem.release("offline", "local", "a")  # idempotent
    assert (await sem.take("offline", "local", "c", 2, 0, 1_000)).taken
    # A place whose task's end was never seen lapses with its lock TTL.
    assert (await sem.take("offline", "local", "d", 2, 1_000, 2_000)).taken


async def test_concurrency_one_holds_the_second_task_until_the_first_ends(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = gated(redis, keys, clock)
    first, second = related("node-1", concurrency=1), related("node-2", concurrency=1)
    await queue(s, first, second)
    await s.dispatch()
    await s.dispatch()
    assert dispatched(s) == ["node-1"]
    assert holds(s, second) == ["held: concurrency: 1 of 1 drain task(s) run on local"]
    await finish(s, first)
    await s.dispatch()
    assert dispatched(s) == ["node-1", "node-2"]


async def test_exclusive_with_holds_by_scope_and_each_blocker_is_announced_once(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = gated(redis, keys, clock)
    fw = [ExclusiveWith(template="fw", scope="target")]
    running = related("node-1", "fw", concurrency=4, concurrent_with=["drain"])
    same_node = related("node-1", concurrency=4, exclusive_with=fw)
    other_node = related("node-2", concurrency=4, exclusive_with=fw)
    await queue(s, running)
    await s.dispatch()
    await queue(s, same_node, other_node)
    for _ in range(3):
        await s.dispatch()
    assert dispatched(s) == ["node-1", "node-2"]
    assert holds(s, same_node) == [f"held: exclusive_with fw on the same target: task "
                                   f"{running.task_id} (fw) runs"]
    await finish(s, running)
    await s.dispatch()
    assert dispatched(s) == ["node-1", "node-2", "node-1"]


async def test_a_failed_dependency_fails_its_dependent_without_running_it(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = gated(redis, keys, clock)
    check = related("node-1", "check", concurrent_with=["drain"])
    dependent = related("node-2", depends_on=[Dependency(template="check")])
    await queue(s, check, dependent)
    await s.dispatch()
    await s.dispatch()
    assert dispatched(s) == ["node-1"]
    assert holds(s, dependent) == [f"held: depends_on check: waits for task "
                                   f"{check.task_id} to finish"]
    await finish(s, check, "failed")
    await s.dispatch()
    assert dispatched(s) == ["node-1"]
    [failed] = [e for e in transitions(s, dependent) if e.state == "failed"]
    assert (failed.previous_state, failed.reason) == (
        "queued", f"depends_on check: task {check.task_id} failed")
    assert failed.outputs["cause"] == "dependency_failed"
    await s.dispatch()  # out of the queue for good
    assert await s.queue.depth() == 0


async def test_a_task_redelivered_after_it_ended_is_not_indexed_again(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = gated(redis, keys, clock)
    done = related("node-1", "check")
    await queue(s, done)
    await s.dispatch()
    await finish(s, done)
    await s.on_task(done)  # the ops.tasks message again
    assert await redis.hlen(keys.open_tasks("local")) == 0
    # So a later dependent does not wait for it.
    dependent = related("node-2", depends_on=[Dependency(template="check")],
                        concurrent_with=["check"])
    await queue(s, dependent)
    await s.dispatch()
    assert dispatched(s) == ["node-1", "node-2"]


class ReadTogether(RelationStore):
    """A store whose first admission read waits until the other scheduler has read too: both
    decide on the same index, as two schedulers racing would."""

    def __init__(self, redis: Redis, keys: Keys, barrier: asyncio.Barrier) -> None:
        super().__init__(redis, keys)
        self.barrier: asyncio.Barrier | None = barrier

    async def _outcomes(self, task_ids: list[str]) -> dict[str, str | None]:
        # Called between the read of the index and the commit.
        if self.barrier is not None:
            barrier, self.barrier = self.barrier, None
            await barrier.wait()
        return await super()._outcomes(task_ids)


async def test_two_schedulers_cannot_both_admit_conflicting_tasks(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    barrier = asyncio.Barrier(2)
    one, two = (scheduler(redis, keys, clock) for _ in range(2))
    for s in (one, two):
        s.relations = RelationGate(ReadTogether(redis, keys, barrier), s.bus, s.clock, 600.0)
    # Different templates on one pool, no concurrent_with: the default exclusion.
    a, b = related("node-1", "drain"), related("node-2", "fill")
    await queue(one, a, b)
    await asyncio.gather(one.dispatch(), two.dispatch())
    # Both read the index before either committed; the second commit found it changed,
    # decided again and held its task.
    assert len(dispatched(one)) + len(dispatched(two)) == 1
    assert len(holds(one, b) + holds(one, a) + holds(two, a) + holds(two, b)) == 1
