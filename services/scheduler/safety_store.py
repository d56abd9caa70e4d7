"""Redis side of the pool safety limits: latest pool health, in-flight offline tasks, alerts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError
from redis.asyncio import Redis

from common.errors import INFRASTRUCTURE_ERRORS
from schemas.events.v1 import OpsTask, PoolHealth
from services.shared.locks import take_place_call
from services.shared.redis_client import Keys, text

# Task id -> (cluster, pool), so a final TaskEvent (which carries no pool) finds its entry;
# a final event arrives within hours, not weeks.
INDEX_TTL_S = 7 * 24 * 3_600

# The budget check and the in-flight count in one step: two schedulers admitting tasks of the
# same pool cannot both see the last free place. KEYS[1] in-flight ZSET, KEYS[2] the task's
# index key; ARGV[1] task id, ARGV[2] capacity (see safety.budget_capacity), ARGV[3] when the
# entry lapses, ARGV[4] now (epoch s), ARGV[5] index value, ARGV[6] index TTL (s).
# Returns {2 already counted | 1 counted now | 0 refused, tasks in flight}.
# A task already counted (redispatched after a crash) keeps its place and its first deadline.
# The in-flight ZSET is a counting semaphore of places, like a template's concurrency.
ADMIT_IN_FLIGHT = """
local place = """ + take_place_call("{KEYS[1]}", "{ARGV[1], ARGV[2], ARGV[4], ARGV[3]}") + """
if place[1] == 1 then redis.call('SET', KEYS[2], ARGV[5], 'EX', ARGV[6]) end
return place
"""

Admission = Literal["counted", "already_counted", "refused"]
_ADMISSIONS: dict[int, Admission] = {1: "counted", 2: "already_counted", 0: "refused"}


@dataclass(frozen=True)
class BudgetAdmission:
    """The outcome of one atomic budget admission, and the in-flight count it saw."""

    outcome: Admission
    in_flight: int

    @property
    def admitted(self) -> bool:
        return self.outcome != "refused"


class SafetyUnreadable(Exception):
    """What the pool limits decide on could not be read: Redis did not answer, or the stored
    health does not decode. Any other error is a bug and is not turned into this."""


HEALTH_UNREADABLE: tuple[type[BaseException], ...] = (*INFRASTRUCTURE_ERRORS, ValidationError)


class SafetyStore:
    """Keeps what the short-circuit and the offline budget decide on."""

    def __init__(self, redis: Redis, keys: Keys, health_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.health_ttl_s = health_ttl_s
        self._admit = redis.register_script(ADMIT_IN_FLIGHT)

    async def node_state(self, cluster: str, node: str) -> str | None:
        """The node's state as the collector keeps it (None if unknown); raises
        SafetyUnreadable."""
        try:
            value = await self.redis.hget(self.keys.node(cluster, node), "state")
        except INFRASTRUCTURE_ERRORS as err:
            raise SafetyUnreadable(repr(err)) from err
        return text(value) if value is not None else None

    def health_key(self, cluster: str, pool: str) -> str:
        return self.keys.pool_health(cluster, pool)

    def in_flight_key(self, cluster: str, pool: str) -> str:
        """ZSET task id -> when its entry lapses (epoch seconds).

        A dispatched task whose end is never seen must not hold the budget forever: its entry
        lapses when its locks would (worst-case run plus margin).
        """
        return self.keys.offline_in_flight(cluster, pool)

    def _task_key(self, task_id: str) -> str:
        return self.keys.offline_task(task_id)

    def alert_key(self, cluster: str, pool: str) -> str:
        return self.keys.short_circuit_alerted(cluster, pool)

    async def save_health(self, health: PoolHealth) -> bool:
        """Keep `health` unless a newer report is already stored; True if kept."""
        key = self.health_key(health.cluster_id, health.pool)
        current = await self.load_health(health.cluster_id, health.pool)
        # A redelivered or reordered report must not replace a newer one. Two schedulers
        # racing here each write a report of the same period, so the race is harmless.
        if current is not None and current.occurred_at >= health.occurred_at:
            return False
        await self.redis.set(key, health.model_dump_json(), ex=self.health_ttl_s)
        return True

    async def load_health(self, cluster: str, pool: str) -> PoolHealth | None:
        """The pool's latest health, None if none is stored; raises SafetyUnreadable."""
        try:
            raw = await self.redis.get(self.health_key(cluster, pool))
            return None if raw is None else PoolHealth.model_validate_json(raw)
        except HEALTH_UNREADABLE as err:
            raise SafetyUnreadable(repr(err)) from err

    async def in_flight(self, cluster: str, pool: str, now_s: float) -> int:
        """Offline tasks dispatched and not yet finished; raises SafetyUnreadable."""
        try:
            return int(await self.redis.zcount(self.in_flight_key(cluster, pool),
                                               f"({now_s}", "+inf"))
        except INFRASTRUCTURE_ERRORS as err:
            raise SafetyUnreadable(repr(err)) from err

    async def admit_in_flight(self, task: OpsTask, capacity: int, lapses_at_s: float,
                              now_s: float) -> BudgetAdmission:
        """Count the task against its pool's budget if fewer than `capacity` are in flight.

        Lapsed entries (tasks whose end was never seen) are dropped first. Raises
        SafetyUnreadable.
        """
        try:
            outcome, count = await self._admit(
                keys=[self.in_flight_key(task.cluster_id, task.pool),
                      self._task_key(str(task.task_id))],
                args=[str(task.task_id), capacity, repr(lapses_at_s), repr(now_s),
                      f"{task.cluster_id} {task.pool}", INDEX_TTL_S],
            )
        except INFRASTRUCTURE_ERRORS as err:
            raise SafetyUnreadable(repr(err)) from err
        return BudgetAdmission(_ADMISSIONS[int(outcome)], int(count))

    async def release_in_flight(self, task: OpsTask) -> None:
        """Give back a place counted for a task that was then not dispatched after all."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.in_flight_key(task.cluster_id, task.pool), str(task.task_id))
            pipe.delete(self._task_key(str(task.task_id)))
            await pipe.execute()

    async def finish(self, task_id: str, now_s: float) -> bool:
        """Stop counting a task that ended; True if it was counted (a replay is a no-op)."""
        raw = await self.redis.get(self._task_key(task_id))
        if raw is None:
            return False
        cluster, _, pool = text(raw).partition(" ")
        key = self.in_flight_key(cluster, pool)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(key, task_id)
            # Lapsed entries of tasks whose end was never seen are pruned on the way.
            pipe.zremrangebyscore(key, "-inf", now_s)
            removed, _ = await pipe.execute()
        return bool(removed)

    async def start_alert_episode(self, cluster: str, pool: str, ttl_s: int) -> bool:
        """True if no short-circuit episode is open for the pool; extends the open one."""
        return not await self.redis.expire(self.alert_key(cluster, pool), ttl_s)

    def firing_key(self, cluster: str, pool: str) -> str:
        """Set while the pool's short-circuit alert fires: unlike the episode it never lapses,
        so the alert is resolved even when the pool recovers after the episode's TTL."""
        return self.keys.short_circuit_firing(cluster, pool)

    async def end_alert_episode(self, cluster: str, pool: str) -> bool:
        """End the pool's short-circuit episode; True if its alert fired (it ends once)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.alert_key(cluster, pool))
            pipe.delete(self.firing_key(cluster, pool))
            _, firing = await pipe.execute()
        return bool(firing)

    async def mark_alerted(self, cluster: str, pool: str, ttl_s: int) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.alert_key(cluster, pool), "1", ex=ttl_s)
            pipe.set(self.firing_key(cluster, pool), "1")
            await pipe.execute()
