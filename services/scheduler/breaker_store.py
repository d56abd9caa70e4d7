"""Breakers in Redis: one hash per (cluster, breaker name), changed only by compare-and-set.

The policy stays in `breaker`; a change is read, computed there, and written by a Lua script
only if the hash's version is still the one read. Two schedulers racing for the single
half-open trial therefore cannot both win: the loser sees a new version and reads again.
A breaker name is a task kind, `<kind>@<node>` or `<kind>@*` (see `breaker`). A node- or
cluster-scoped breaker that is not closed is also a member of its cluster's hold set
(`Keys.breaker_holds`), changed in the same script as its hash: the scheduler reads that set
once a tick to hold back every task the breaker stops, the router to keep ML tasks away
from a stopped node.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from common.clock import EpochClock
from common.errors import INFRASTRUCTURE_ERRORS
from schemas.events.v1 import OpsTask
from services.scheduler import breaker
from services.scheduler.breaker import BreakerConfig, BreakerState, Decision, Outcome
from services.shared.audit import AuditLog, AuditRecord, Role, VersionedWrite
from services.shared.breaker_holds import holding
from services.shared.locks import Locks
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.scheduler.breaker")

UNREADABLE = "breaker state unreadable"
# A redelivered TaskEvent arrives within hours, not weeks; a week bounds the dedupe keys.
DEDUPE_TTL_MS = 7 * 24 * 3_600_000
TASK_INDEX_TTL_S = 7 * 24 * 3_600
CAS_ATTEMPTS = 20

# KEYS[1] breaker hash, KEYS[2] dedupe key, KEYS[3] the cluster's hold set; ARGV[1] version
# read, ARGV[2] '1' to dedupe, ARGV[3] dedupe TTL (ms), ARGV[4] '+' / '-' to add the breaker
# to / remove it from the hold set ('' neither), ARGV[5] its name, ARGV[6..] field/value
# pairs. Returns 1 written, 0 version moved on, -1 already recorded.
CAS = """
local dedupe = ARGV[2] == '1'
if dedupe and redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if current ~= tonumber(ARGV[1]) then return 0 end
if dedupe then redis.call('SET', KEYS[2], '1', 'PX', ARGV[3]) end
if ARGV[4] == '+' then redis.call('SADD', KEYS[3], ARGV[5]) end
if ARGV[4] == '-' then redis.call('SREM', KEYS[3], ARGV[5]) end
redis.call('HSET', KEYS[1], 'version', current + 1, unpack(ARGV, 6))
return 1
"""

# What a CAS write did, by the script's answer.
Write = Literal["written", "moved_on", "already_recorded"]
_WRITES: dict[int, Write] = {1: "written", 0: "moved_on", -1: "already_recorded"}

REQUEUE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[3], ARGV[1]) or 0, ARGV[1])
return 1
"""


class BreakerUnreadable(Exception):
    """The breaker's hash could not be read or parsed."""


# What admitting fails closed on: the state unreadable, or Redis not answering the trial's write.
ADMIT_UNREADABLE: tuple[type[BaseException], ...] = (BreakerUnreadable, *INFRASTRUCTURE_ERRORS)


@dataclass(frozen=True)
class BreakerReset:
    """An audited reset: the state before and after, and its audit entry."""

    before: BreakerState
    after: BreakerState
    record: AuditRecord


@dataclass(frozen=True)
class TaskIndex:
    """What a task's outcome is counted against: its cluster, kind, target and breaker (''
    in an entry indexed before breakers were)."""

    cluster: str
    kind: str
    target: str
    breaker: str = ""


def encode(state: BreakerState) -> list[str]:
    """The state as hash field/value pairs (readable with HGETALL)."""
    fields = {
        "status": state.status,
        "window": "".join("F" if failed else "S" for failed in state.window),
        "window_at": ",".join(repr(at) for at in state.window_at),
        "consecutive_failures": str(state.consecutive_failures),
        "opened_at": "" if state.opened_at is None else repr(state.opened_at),
        "openings": str(state.openings),
        "trial_task": state.trial_task,
        "trial_at": "" if state.trial_at is None else repr(state.trial_at),
    }
    return [item for pair in fields.items() for item in pair]


def decode(raw: dict[str, str]) -> tuple[BreakerState, int]:
    """A hash as read back: the state and its version (an empty hash is a new breaker)."""
    if not raw:
        return BreakerState(), 0
    try:
        state = BreakerState.model_validate_json(json.dumps({
            "status": raw["status"],
            "window": [c == "F" for c in raw.get("window", "")],
            "window_at": [float(at) for at in raw.get("window_at", "").split(",") if at],
            "consecutive_failures": int(raw.get("consecutive_failures", "0")),
            "opened_at": float(raw["opened_at"]) if raw.get("opened_at") else None,
            "openings": int(raw.get("openings", "0")),
            "trial_task": raw.get("trial_task", ""),
            "trial_at": float(raw["trial_at"]) if raw.get("trial_at") else None,
        }))
        return state, int(raw.get("version", "0"))
    except (KeyError, ValueError) as err:
        raise BreakerUnreadable(f"corrupt breaker hash: {err}") from err


def hold_op(name: str, state: BreakerState) -> str:
    """How a write of `state` to breaker `name` changes its cluster's hold set."""
    if not breaker.holds_beyond_its_kind(name):
        return ""
    return "-" if state.status == "CLOSED" else "+"


class BreakerStore:
    """Reads and changes breakers atomically; unreadable means closed to automation."""

    def __init__(self, redis: Redis, keys: Keys, config_for: Callable[[str], BreakerConfig],
                 clock: EpochClock = time.time) -> None:
        self.redis = redis
        self.keys = keys
        self._config_for_kind = config_for
        self.clock = clock
        self._cas = redis.register_script(CAS)
        self._locks = Locks(redis, keys)
        self._requeue = redis.register_script(REQUEUE)

    def config_for(self, name: str) -> BreakerConfig:
        """The limits of breaker `name`: those of its task kind, whatever the scope."""
        return self._config_for_kind(breaker.kind_of(name))

    def key(self, cluster: str, kind: str) -> str:
        return self.keys.breaker(cluster, kind)

    def _key_prefix(self) -> str:
        return self.keys.breaker_prefix()

    def _dedupe_key(self, task_id: str) -> str:
        return self.keys.breaker_recorded(task_id)

    def _task_key(self, task_id: str) -> str:
        return self.keys.breaker_task(task_id)

    def alert_key(self, cluster: str, kind: str, openings: int) -> str:
        return self.keys.breaker_alerted(cluster, kind, openings)

    async def load(self, cluster: str, kind: str) -> tuple[BreakerState, int]:
        """The breaker's state and version; raises BreakerUnreadable."""
        try:
            raw = await self.redis.hgetall(self.key(cluster, kind))
        except INFRASTRUCTURE_ERRORS as err:
            raise BreakerUnreadable(repr(err)) from err
        return decode({text(k): text(v) for k, v in raw.items()})

    def holds_key(self, cluster: str) -> str:
        return self.keys.breaker_holds(cluster)

    async def holding(self, cluster: str) -> set[str]:
        """The node- and cluster-scoped breakers of `cluster` that are not closed."""
        return await holding(self.redis, self.keys, cluster)

    async def _write(self, cluster: str, kind: str, version: int, state: BreakerState,
                     dedupe_task: str = "") -> Write:
        return _WRITES[int(await self._cas(
            keys=[self.key(cluster, kind), self._dedupe_key(dedupe_task or "-"),
                  self.holds_key(cluster)],
            args=[version, "1" if dedupe_task else "0", DEDUPE_TTL_MS, hold_op(kind, state),
                  kind, *encode(state)],
        ))]

    async def admit(self, cluster: str, kind: str,
                    task_id: str) -> tuple[Decision, BreakerState | None]:
        """Whether the task may be dispatched (and the state seen, if it could be read).

        A half-open trial is taken atomically: only one caller's write succeeds.
        """
        config = self.config_for(kind)
        for _ in range(CAS_ATTEMPTS):
            try:
                state, version = await self.load(cluster, kind)
                now = self.clock()
                decision = breaker.admits(state, now, config)
                if not decision.half_open_trial:
                    return decision, state
                trial = breaker.begin_trial(state, task_id, now)
                if await self._write(cluster, kind, version, trial) == "written":
                    log.warning("breaker %s/%s half-open: task %s is the trial",
                                cluster, kind, task_id)
                    return decision, trial
            except ADMIT_UNREADABLE as err:
                # Fail closed: without the breaker's state nothing of its kind runs. Any other
                # error is a bug: it propagates rather than hold the kind back for ever.
                log.warning("breaker %s/%s unreadable: %r", cluster, kind, err)
                return Decision(allowed=False, reason=UNREADABLE), None
        return Decision(allowed=False, reason="breaker busy; retried next tick"), None

    async def record(self, cluster: str, kind: str,
                     outcome: Outcome) -> tuple[BreakerState, BreakerState] | None:
        """Record a task's outcome once: (before, after), or None if already recorded."""
        config = self.config_for(kind)
        for _ in range(CAS_ATTEMPTS):
            state, version = await self.load(cluster, kind)
            after = breaker.record(state, outcome, self.clock(), config)
            written = await self._write(cluster, kind, version, after, outcome.task_id)
            if written == "already_recorded":
                return None
            if written == "written":
                return state, after
        raise BreakerUnreadable(f"breaker {cluster}/{kind} kept changing; retry later")

    async def release_trial(self, cluster: str, kind: str, task_id: str) -> bool:
        """Give up the half-open trial if `task_id` held it; True if it did.

        For a trial that will not report an outcome the breaker counts (the agent rejected
        its command, or the task went back to the queue): without this the breaker would
        wait out the half-open limit for it.
        """
        for _ in range(CAS_ATTEMPTS):
            state, version = await self.load(cluster, kind)
            after = breaker.release_trial(state, task_id)
            if after == state:
                return False
            if await self._write(cluster, kind, version, after) == "written":
                log.warning("breaker %s/%s: trial %s not counted; back to open",
                            cluster, kind, task_id)
                return True
        raise BreakerUnreadable(f"breaker {cluster}/{kind} kept changing; retry later")

    async def reset(self, cluster: str, kind: str, actor: str, reason: str, audit: AuditLog,
                    role: Role = "admin") -> BreakerReset:
        """An admin's reset and its audit entry, written together or not at all."""
        for _ in range(CAS_ATTEMPTS):
            state, version = await self.load(cluster, kind)
            after = breaker.reset(state)
            record = await audit.append_guarded(
                actor=actor, role=role, action="breaker_reset", target=f"{cluster}/{kind}",
                reason=reason, result=f"{state.status} -> {after.status}",
                guard=VersionedWrite(self.key(cluster, kind), version, encode(after),
                                     unset=(self.holds_key(cluster), kind)),
            )
            if record is not None:
                log.warning("breaker %s/%s reset by %s (%s -> %s): %s", cluster, kind, actor,
                            state.status, after.status, reason)
                return BreakerReset(state, after, record)
        raise BreakerUnreadable(f"breaker {cluster}/{kind} kept changing; retry later")

    async def states(self) -> list[tuple[str, str, BreakerState | None]]:
        """Every breaker stored: (cluster, name, state or None if unreadable), sorted."""
        prefix = self._key_prefix()
        found: list[tuple[str, str, BreakerState | None]] = []
        async for raw_key in self.redis.scan_iter(match=f"{prefix}*", count=500):
            cluster, _, name = text(raw_key)[len(prefix):].partition(":")
            try:
                state: BreakerState | None = (await self.load(cluster, name))[0]
            except BreakerUnreadable:
                state = None
            found.append((cluster, name, state))
        return sorted(found, key=lambda row: (row[0], row[1]))

    async def remember_task(self, task: OpsTask, name: str = "") -> None:
        """Index task id -> (cluster, kind, target, breaker name), for outcome events that
        carry none of it (the name fixes the scope the task was queued with)."""
        await self.redis.set(self._task_key(str(task.task_id)),
                             f"{task.cluster_id} {task.kind} {task.target} {name}",
                             ex=TASK_INDEX_TTL_S)

    async def task_index(self, task_id: str) -> TaskIndex | None:
        raw = await self.redis.get(self._task_key(task_id))
        if raw is None:
            return None
        # Identifiers hold no spaces; an entry from before targets were indexed has none.
        cluster, _, rest = text(raw).partition(" ")
        kind, _, rest = rest.partition(" ")
        target, _, name = rest.partition(" ")
        return TaskIndex(cluster, kind, target, name)

    async def alerted(self, cluster: str, kind: str, openings: int) -> bool:
        return bool(await self.redis.exists(self.alert_key(cluster, kind, openings)))

    async def mark_alerted(self, cluster: str, kind: str, openings: int) -> None:
        await self.redis.set(self.alert_key(cluster, kind, openings), "1",
                             ex=TASK_INDEX_TTL_S)

    async def release_claim(self, task: OpsTask) -> None:
        """Free the locks a claimed task took, keeping it leased (out of the ready queue)."""
        await self._locks.release_all(str(task.task_id), task.mutex_keys)

    async def requeue(self, task_id: str) -> bool:
        """Return a leased task to the ready queue with its score."""
        return bool(await self._requeue(
            keys=[self.keys.queue_inflight(), self.keys.queue_ready(), self.keys.queue_scores()],
            args=[task_id],
        ))
