"""Redis side of the relation gate: the open tasks of each cluster, the outcomes of finished
ones, the concurrency semaphore, and which holds a task's transitions announced already.

An admission is decided in Python (`services/scheduler/relations.py`) on one read of the
cluster's index and committed by one script only if the index did not change since (its
version) and the template's semaphore has a place: two schedulers cannot both admit tasks
that conflict, since the second one's commit finds the version moved and decides again.
"""

from __future__ import annotations

from redis.asyncio import Redis

from common.errors import INFRASTRUCTURE_ERRORS
from schemas.events.v1 import OpsTask, TaskRelations
from services.scheduler import relations
from services.scheduler.relations import Decision, OpenTask
from services.shared.locks import take_place_call
from services.shared.redis_client import Keys, text

# A finished task's outcome is remembered this long for the tasks depending on it; a
# dependent queued longer than that proceeds as if the other finished well.
OUTCOME_TTL_S = 7 * 24 * 3_600
NOTICE_TTL_S = 7 * 24 * 3_600
COMMIT_TRIES = 3

# KEYS[1] the index, KEYS[2] its version, KEYS[3] the template's semaphore; ARGV[1] the
# version read, ARGV[2] task id, ARGV[3] its entry as running, then the semaphore's
# arguments (limit, now, lapse). Returns 1 admitted, 0 the index changed, {-1, held} no place.
ADMIT = """
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
local place = """ + take_place_call("{KEYS[3]}", "{ARGV[2], ARGV[4], ARGV[5], ARGV[6]}") + """
if place[1] == 0 then return {-1, place[2]} end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('INCR', KEYS[2])
return 1
"""


class RelationsUnreadable(Exception):
    """The open-task index could not be read or written (the gate fails closed)."""


class RelationStore:
    """The open-task index and its atomic admission."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._admit = redis.register_script(ADMIT)

    async def _entries(self, cluster: str) -> tuple[str, dict[str, OpenTask]]:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self.keys.open_tasks_version(cluster))
            pipe.hgetall(self.keys.open_tasks(cluster))
            version, raw = await pipe.execute()
        entries = {text(k): OpenTask.from_json(text(v)) for k, v in raw.items()}
        return (text(version) if version is not None else "0"), entries

    async def enter(self, task: OpsTask) -> None:
        """Index a task being queued, with the tasks it depends on that are open now (a
        redelivered task keeps its first entry, which may be running by now)."""
        if task.relations is None:
            return
        if await self.redis.exists(self.keys.task_outcome(str(task.task_id))):
            return  # redelivered after it ended: an entry now would never be removed
        cluster = task.cluster_id
        _, entries = await self._entries(cluster)
        me = relations.open_task(task, task.relations)
        me = relations.open_task(task, task.relations,
                                 relations.dependencies(me, entries.values()))
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.keys.open_tasks(cluster), me.task_id, me.to_json())
            pipe.incr(self.keys.open_tasks_version(cluster))
            await pipe.execute()

    async def admit(self, task: OpsTask, rel: TaskRelations, now_ms: int,
                    lapses_at_ms: int) -> Decision:
        """The relation gate, committed atomically when it admits; raises
        RelationsUnreadable."""
        try:
            return await self._admit_once_settled(task, rel, now_ms, lapses_at_ms)
        except INFRASTRUCTURE_ERRORS as err:
            raise RelationsUnreadable(repr(err)) from err

    async def _admit_once_settled(self, task: OpsTask, rel: TaskRelations, now_ms: int,
                                  lapses_at_ms: int) -> Decision:
        cluster, task_id = task.cluster_id, str(task.task_id)
        for _ in range(COMMIT_TRIES):
            version, entries = await self._entries(cluster)
            # Not indexed (queued before the index existed, or its entry lost): no waits.
            me = entries.get(task_id) or relations.open_task(task, rel)
            outcomes = await self._outcomes([i for i, _ in me.waits_for])
            decision = relations.decide(me, entries.values(), outcomes, now_ms)
            if decision.verdict != "admit":
                return decision
            running = OpenTask(**{**me.__dict__, "state": "running",
                                  "lapses_at_ms": lapses_at_ms})
            reply = await self._admit(
                keys=[self.keys.open_tasks(cluster), self.keys.open_tasks_version(cluster),
                      self.keys.semaphore(rel.template, cluster)],
                args=[version, task_id, running.to_json(), rel.concurrency, now_ms,
                      lapses_at_ms])
            if isinstance(reply, list):
                return relations.concurrency_hold(me, cluster, int(reply[1]))
            if int(reply) == 1:
                return decision
        return Decision("hold", "open tasks of the cluster changing; tried again next tick",
                        "busy")

    async def _outcomes(self, task_ids: list[str]) -> dict[str, str | None]:
        if not task_ids:
            return {}
        raw = await self.redis.mget([self.keys.task_outcome(i) for i in task_ids])
        return {i: (text(v) if v is not None else None)
                for i, v in zip(task_ids, raw, strict=True)}

    async def unadmit(self, task: OpsTask, rel: TaskRelations) -> None:
        """Undo an admission: a later limit held the task back, so it is queued again."""
        cluster, task_id = task.cluster_id, str(task.task_id)
        raw = await self.redis.hget(self.keys.open_tasks(cluster), task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            if raw is not None:
                entry = OpenTask.from_json(text(raw))
                queued = OpenTask(**{**entry.__dict__, "state": "queued", "lapses_at_ms": 0})
                pipe.hset(self.keys.open_tasks(cluster), task_id, queued.to_json())
            pipe.zrem(self.keys.semaphore(rel.template, cluster), task_id)
            pipe.incr(self.keys.open_tasks_version(cluster))
            await pipe.execute()

    async def finish(self, cluster: str, task_id: str, state: str) -> None:
        """A task ended: out of the index and its semaphore, its outcome remembered.
        Idempotent (a replayed final event finds nothing left to remove)."""
        raw = await self.redis.hget(self.keys.open_tasks(cluster), task_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            if raw is not None:
                entry = OpenTask.from_json(text(raw))
                pipe.zrem(self.keys.semaphore(entry.template, cluster), task_id)
                pipe.hdel(self.keys.open_tasks(cluster), task_id)
            pipe.set(self.keys.task_outcome(task_id), state, ex=OUTCOME_TTL_S)
            pipe.incr(self.keys.open_tasks_version(cluster))
            await pipe.execute()

    async def first_notice(self, task_id: str, blocker: str) -> bool:
        """True the first time a hold of `task_id` by `blocker` is to be announced."""
        return bool(await self.redis.set(self.keys.relation_notice(task_id, blocker), "1",
                                         nx=True, ex=NOTICE_TTL_S))

    async def forget_notice(self, task_id: str, blocker: str) -> None:
        """The announcement could not be published: announce it again next time."""
        await self.redis.delete(self.keys.relation_notice(task_id, blocker))
