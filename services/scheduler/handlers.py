"""Scheduler handlers: tasks in, queued; a dispatcher loop hands them to the executor.

Before a claimed task is dispatched it passes, in this order: maintenance (no window of its
cluster or of a node it touches; a held task's transitions say which), its relations (its
template's concurrency, exclusive_with, depends_on and the default exclusion on a pool that
concurrent_with lifts: `relation_gate.py`; a hold's transitions say which), its breaker, the pool's
short-circuit, the pool's offline budget (budgeted kinds) and its kind's rate limit
(rate-limited kinds). All of them key on `task.kind`. A task refused anywhere waits in the
queue; a place in the budget taken for it is given back if the rate limit then refuses.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Literal
from uuid import uuid4, uuid5

from opentelemetry import trace

from common.clock import Clock
from common.crashpoints import crash_point
from common.errors import PermanentError
from common.messaging import EventBus
from common.tracing import resumed_context, task_attributes
from schemas import ids
from schemas.envelope import IDENTIFIER_MAX, short_text
from schemas.events.v1 import (
    Alert,
    OpsTask,
    PoolHealth,
    TaskEvent,
    TaskScheduled,
    TaskState,
    now_utc,
)
from schemas.topics import Topic
from services.scheduler import breaker as breakers
from services.scheduler import policy, safety
from services.scheduler.breaker import BreakerState, Outcome, breaker_name
from services.scheduler.breaker_store import (
    ADMIT_UNREADABLE,
    BreakerReset,
    BreakerStore,
    BreakerUnreadable,
)
from services.scheduler.events import SOURCE, task_event
from services.scheduler.queue import TaskQueue
from services.scheduler.rate_limit import RateLimiter, RateLimitUnreadable
from services.scheduler.relation_gate import RelationGate
from services.scheduler.relations_store import RelationStore
from services.scheduler.safety import Verdict
from services.scheduler.safety_store import SafetyStore, SafetyUnreadable
from services.scheduler.settings import SchedulerSettings
from services.shared.locks import lock_ttl_s
from services.shared.maintenance import MaintenanceStore, MaintenanceUnreadable

log = logging.getLogger("clusterwarden.scheduler")
_tracer = trace.get_tracer("clusterwarden.scheduler")
FINAL_OUTCOMES: frozenset[TaskState] = frozenset({"succeeded", "failed"})
# A terminated task fed no outcome to its breaker, but its node is back in the budget.
FINAL_STATES: frozenset[TaskState] = FINAL_OUTCOMES | {"terminated"}
# The executor's `cause` of a failure the agent refused before doing anything (a precondition,
# a stale command): it says nothing about whether the adjustment works, so no breaker counts it.
REJECTED = "rejected"
# Failed by the scheduler because a task it depends on failed: it never ran, so it says
# nothing about its kind either.
NOT_COUNTED = frozenset({REJECTED, "dependency_failed"})

# "trial": admitted as the breaker's half-open trial; "counted": admitted and counted in the
# pool's budget by this call. Both are undone if a later limit holds the task back.
BreakerAdmission = Literal["refused", "admitted", "trial"]
PoolAdmission = Literal["refused", "admitted", "counted"]


def dedup_key(*parts: str) -> str:
    """An alert's dedup key (an Identifier) from identifiers and breaker names.

    `@` and `*` (of node- and cluster-scoped names) are not allowed in an Identifier, and two
    128-character ids would be too long: a long key keeps its start and ends in a hash.
    """
    joined = ".".join(parts).replace(f"@{breakers.WHOLE_CLUSTER}", "").replace("@", ".")
    if len(joined) <= IDENTIFIER_MAX:
        return joined
    digest = hashlib.sha256(joined.encode()).hexdigest()[:16]
    return f"{joined[:IDENTIFIER_MAX - 17]}.{digest}"


def reset_alert(cluster: str, name: str, reset: BreakerReset, source: str) -> Alert:
    """The alert that resolves the breaker's open alert and says who reset it and why (one
    per audit entry)."""
    entry = reset.record.entry
    key = breaker_alert_key(cluster, name)
    return Alert(
        event_id=uuid5(ids.BREAKER_RESETS, reset.record.hash), source=source, occurred_at=now_utc(),
        cluster_id=cluster, subject=key, severity="info", kind="breaker_reset", dedup_key=key,
        status="resolved",
        message=short_text(f"breaker {name} on {cluster} reset by {entry.actor} "
                           f"({reset.before.status} -> {reset.after.status}): {entry.reason}"),
    )


def breaker_alert_key(cluster: str, name: str) -> str:
    """The dedup key of a breaker's open alert (its reset resolves the same key):
    `breaker.<cluster>.<scope>.<kind>[.<node>]`."""
    return dedup_key("breaker", cluster, breakers.scope_of(name), name)


def stopped_what(cluster: str, name: str) -> str:
    """What an open breaker stops, in words."""
    scope = breakers.scope_of(name)
    if scope == "node":
        return f"ops tasks and ML tasks on node {breakers.node_of(name)}"
    if scope == "cluster":
        return f"every ops task of cluster {cluster}"
    return f"{name} tasks on {cluster}"


def short_circuit_alert_key(cluster: str, pool: str) -> str:
    return dedup_key("short-circuit", cluster, pool)


@dataclass
class Tick:
    """What one dispatcher tick learnt: a breaker or a bucket that said no says no all tick."""

    held: list[str] = field(default_factory=list)
    blocked_breakers: set[tuple[str, str]] = field(default_factory=set)
    # Per cluster, its node- and cluster-scoped breakers not closed (None: unreadable).
    holding: dict[str, set[str] | None] = field(default_factory=dict)
    seen_holds: set[tuple[str, str]] = field(default_factory=set)
    empty_buckets: set[tuple[str, str]] = field(default_factory=set)
    # Failed by the relation gate: out of the queue, not to be requeued.
    ended: set[str] = field(default_factory=set)


class Scheduler:
    """Queues every task once and dispatches the most urgent task whose targets are free."""

    def __init__(self, settings: SchedulerSettings, queue: TaskQueue, bus: EventBus,
                 breakers: BreakerStore, safety_store: SafetyStore,
                 rate_limiter: RateLimiter, clock: Clock = now_utc,
                 maintenance: MaintenanceStore | None = None,
                 relations: RelationStore | None = None) -> None:
        self.settings = settings
        self.maintenance = maintenance
        self.relations = (None if relations is None else
                          RelationGate(relations, bus, clock, settings.lock_margin_s))
        self.queue = queue
        self.bus = bus
        self.breakers = breakers
        self.safety = safety_store
        self.rate_limiter = rate_limiter
        self.clock = clock

    def breaker_of(self, task: OpsTask) -> str:
        """The name of the breaker `task` counts against in its cluster."""
        return breaker_name(task.kind, task.target,
                            self.settings.scope_of(task.kind, task.breaker_scope))

    async def on_task(self, task: OpsTask) -> None:
        # Indexed before queueing, so the task's outcome can always be tied to its breaker.
        await self.breakers.remember_task(task, self.breaker_of(task))
        if self.relations is not None:
            await self.relations.enter(task)
        new = await self.queue.enqueue(
            task, policy.queue_score(task), lock_ttl_s(task, self.settings.lock_margin_s)
        )
        # Published even for a redelivered task: its id is fixed, so consumers dedupe it, and a
        # crash between the enqueue and this publish cannot lose the transition.
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS, task_event(task, "queued", "created", "queued by priority",
                                                self.clock())
        )
        if new:
            log.info("queued task %s (priority %s)", task.task_id, task.priority)

    async def dispatch(self) -> None:
        """One dispatcher tick: requeue expired leases, then dispatch what can run."""
        now_ms = int(self.clock().timestamp() * 1000)
        if reaped := await self.queue.reap(now_ms):
            log.warning("requeued %d task(s) whose dispatcher did not finish", reaped)
        lease_ms = int(self.settings.lease_s * 1000)
        tick = Tick()
        try:
            await self._dispatch_claimed(now_ms, lease_ms, tick)
        finally:
            # Held out of the ready queue until now, so one blocked task cannot be claimed
            # over and over in a tick; if this fails, the lease ends and the reaper requeues.
            for task_id in tick.held:
                if task_id not in tick.ended:
                    await self.breakers.requeue(task_id)

    async def _dispatch_claimed(self, now_ms: int, lease_ms: int, tick: Tick) -> None:
        """Claim and dispatch until nothing is free; tasks refused go to `tick.held`."""
        for _ in range(100):
            claimed = await self.queue.claim(now_ms, lease_ms, self.settings.scan_limit)
            if claimed is None:
                return
            # In the trace the task was queued in (the loop has no message to continue): what
            # its limits publish about it and its dispatch belong to the need it came from.
            with resumed_context(claimed.trace_context):
                await self._dispatch_one(claimed.task, now_ms, tick)

    async def _dispatch_one(self, task: OpsTask, now_ms: int, tick: Tick) -> None:
        """Dispatch one claimed task, or hold it back (in `tick.held`) if a limit refuses.

        Only a dispatch is a span: a task held back is claimed again every tick, and a span
        each time would bury its trace."""
        crash_point("scheduler.after_claim")
        if not await self._admits(task, now_ms, tick):
            await self.breakers.release_claim(task)
            if str(task.task_id) in tick.ended:
                await self.queue.ack(str(task.task_id))
            else:
                tick.held.append(str(task.task_id))
            return
        with _tracer.start_as_current_span("scheduler.dispatch",
                                           attributes=task_attributes(task)) as span:
            epoch = await self.queue.dispatch_epoch(
                task, lock_ttl_s(task, self.settings.lock_margin_s), self.clock())
            span.set_attribute("task.epoch", epoch)
            crash_point("scheduler.before_dispatch")
            # The transition first: once the executor has the task it publishes `running`,
            # and the task's events must arrive in the order they happened.
            await self.bus.publish(
                Topic.OPS_TASK_EVENTS,
                task_event(task, "dispatched", "queued", f"locks {task.mutex_keys} held; "
                           f"epoch {epoch}", self.clock(), str(epoch)),
            )
            await self.bus.publish(
                Topic.OPS_TASKS_SCHEDULED,
                TaskScheduled(
                    event_id=uuid5(ids.TASK_EVENTS, f"{task.task_id}:scheduled:{epoch}"),
                    source=SOURCE, occurred_at=self.clock(), cluster_id=task.cluster_id,
                    subject=str(task.task_id), correlation_id=str(task.need_id),
                    task=task, epoch=epoch,
                ),
            )
            crash_point("scheduler.after_dispatch")
            await self.queue.ack(str(task.task_id))
            log.info("dispatched task %s (%s) with epoch %d", task.task_id, task.kind, epoch)

    async def _admits(self, task: OpsTask, now_ms: int, tick: Tick) -> bool:
        """Every limit a task must pass before it is dispatched (see the module docstring)."""
        if not await self._maintenance_admits(task):
            return False
        related = "unbound" if self.relations is None else await self.relations.admit(
            task, now_ms)
        if related in ("refused", "failed"):
            if related == "failed":
                tick.ended.add(str(task.task_id))
            return False
        if await self._limits_admit(task, now_ms, tick):
            return True
        if related == "admitted" and self.relations is not None:
            await self.relations.undo(task)
        return False

    async def _limits_admit(self, task: OpsTask, now_ms: int, tick: Tick) -> bool:
        """The breaker, the pool and the rate limit; what one took is given back if a later
        one refuses."""
        breaker = await self._breaker_admits(task, tick)
        if breaker == "refused":
            return False
        # A bucket found empty this tick stays empty: no budget round trip to learn it again.
        pool: PoolAdmission = "refused"
        if (task.cluster_id, task.kind) not in tick.empty_buckets:
            pool = await self._pool_admits(task, now_ms)
        if pool != "refused" and await self._rate_admits(task, tick.empty_buckets):
            return True
        if pool == "counted":
            # Counted before the rate limit was asked, so no other scheduler could take the
            # place meanwhile; given back now as the task waits. A crash before this line
            # over-counts until the entry lapses: safe.
            await self.safety.release_in_flight(task)
        if breaker == "trial":
            # A trial that waits in the queue reports nothing: give it up, so the breaker
            # offers the next task a trial instead of waiting out the half-open limit.
            await self.breakers.release_trial(task.cluster_id, self.breaker_of(task),
                                              str(task.task_id))
        return False

    async def _maintenance_admits(self, task: OpsTask) -> bool:
        """No maintenance window holds the task; a hold is announced as a `queued` transition
        naming the window (once per window: published, then remembered; the event's id is
        fixed, so a second announcement after a crash is the same event)."""
        if self.maintenance is None:
            return True
        try:
            window = await self.maintenance.holding(task)
            if window is None:
                return True
            noticed = await self.maintenance.noticed(window, str(task.task_id))
        except MaintenanceUnreadable as err:
            log.warning("task %s held back: maintenance windows unreadable: %s",
                        task.task_id, err)
            return False  # fail closed, like every other limit
        if not noticed:
            await self.bus.publish(Topic.OPS_TASK_EVENTS, task_event(
                task, "queued", "queued", short_text(f"held: {window.describe()}"),
                self.clock(), f"maintenance:{window.window_id}"))
            await self.maintenance.mark_noticed(window, str(task.task_id))
        log.info("task %s held back by %s", task.task_id, window.describe())
        return False

    async def _breaker_admits(self, task: OpsTask, tick: Tick) -> BreakerAdmission:
        """Ask the node- and cluster-scoped breakers holding the task's cluster (read once a
        tick), then the task's own breaker (once per tick for a breaker that said no)."""
        key = (task.cluster_id, self.breaker_of(task))
        if key in tick.blocked_breakers:
            return "refused"
        if await self._held_beyond(task, key[1], tick):
            return "refused"
        blocked = tick.blocked_breakers
        decision, state = await self.breakers.admit(*key, str(task.task_id))
        if decision.allowed:
            return "trial" if decision.half_open_trial else "admitted"
        blocked.add(key)
        log.warning("task %s held back by breaker %s/%s: %s", task.task_id, *key,
                    decision.reason)
        if state is not None and state.status != "CLOSED":
            # Also here, not only where the breaker opened: an alert lost to a crash there is
            # raised by the next task the breaker holds back.
            await self.alert_open(*key, state)
        return "refused"

    async def _held_beyond(self, task: OpsTask, own: str, tick: Tick) -> bool:
        """True if another breaker than the task's own stops it: one of its node or of its
        whole cluster. Unreadable holds hold everything of the cluster (fail closed)."""
        cluster = task.cluster_id
        if cluster not in tick.holding:
            try:
                tick.holding[cluster] = await self.breakers.holding(cluster)
            except ADMIT_UNREADABLE as err:
                log.warning("breaker holds of %s unreadable: %r", cluster, err)
                tick.holding[cluster] = None
        holding = tick.holding[cluster]
        if holding is None:
            log.warning("task %s held back: breaker holds of %s unreadable", task.task_id,
                        cluster)
            return True
        by = breakers.blocking(holding, own, task.target)
        if by is None:
            return False
        log.warning("task %s held back by breaker %s/%s (%s scope)", task.task_id, cluster,
                    by, breakers.scope_of(by))
        if (cluster, by) not in tick.seen_holds:
            tick.seen_holds.add((cluster, by))
            # As for a kind's own breaker: an alert lost to a crash is raised again here.
            try:
                state, _ = await self.breakers.load(cluster, by)
            except BreakerUnreadable:
                return True
            if state.status != "CLOSED":
                await self.alert_open(cluster, by, state)
        return True

    async def _pool_admits(self, task: OpsTask, now_ms: int) -> PoolAdmission:
        """The pool's short-circuit, then (for budgeted kinds) its offline budget.

        The budget is checked and the task counted in one atomic step ("counted"), so two
        schedulers cannot both take the pool's last place.
        """
        now = self.clock()
        kind = safety.safety_kind(task, self.settings.budget_kinds)
        budgeted = kind in self.settings.budget_kinds
        try:
            health = await self.safety.load_health(task.cluster_id, task.pool)
            target_state = (await self.safety.node_state(task.cluster_id, task.target)
                            if budgeted else None)
        except SafetyUnreadable as err:
            # Fail closed: without the pool's health nothing runs. Only an unreadable state is
            # caught: a bug propagates rather than hold every task of the pool for ever.
            log.warning("task %s held back: pool safety state unreadable: %r",
                        task.task_id, err)
            return "refused"
        verdict = safety.short_circuit(
            health, kind, now, self.settings.pool_health_max_age_s,
            self.settings.short_circuit_unhealthy_fraction,
            self.settings.breaker_disruptive_kinds)
        if not verdict.allowed:
            await self._pool_refused(task, verdict)
            return "refused"
        if not budgeted:
            return "admitted"
        if health is None:
            await self._pool_refused(task, Verdict(allowed=False,
                                                   reason=safety.NO_HEALTH_BUDGET))
            return "refused"
        capacity = safety.budget_capacity(
            health, self.settings.offline_budget_fraction,
            target_not_ready=target_state in safety.NOT_READY_STATES)
        lapses_at_s = now_ms / 1000 + lock_ttl_s(task, self.settings.lock_margin_s)
        try:
            admission = await self.safety.admit_in_flight(task, capacity, lapses_at_s,
                                                          now.timestamp())
        except SafetyUnreadable as err:
            log.warning("task %s held back: offline budget unreadable: %r", task.task_id, err)
            return "refused"
        if not admission.admitted:
            await self._pool_refused(task, safety.budget_used_up(task.pool,
                                                                 admission.in_flight))
            return "refused"
        return "counted" if admission.outcome == "counted" else "admitted"

    async def _pool_refused(self, task: OpsTask, verdict: Verdict) -> None:
        log.warning("task %s held back by pool %s/%s: %s", task.task_id, task.cluster_id,
                    task.pool, verdict.reason)
        if verdict.alert:
            await self.alert_short_circuit(task.cluster_id, task.pool, verdict)

    async def _rate_admits(self, task: OpsTask, empty: set[tuple[str, str]]) -> bool:
        """Take a token of the task's kind if the kind is rate limited."""
        if task.kind not in self.settings.rate_limited_kinds:
            return True
        key = (task.cluster_id, task.kind)
        if key in empty:
            return False
        try:
            decision = await self.rate_limiter.take(*key)
        except RateLimitUnreadable as err:
            # Fail closed, like every other limit.
            log.warning("task %s held back: rate limit %s/%s unreadable: %r",
                        task.task_id, *key, err)
            empty.add(key)
            return False
        if decision.allowed:
            return True
        empty.add(key)
        # Info, not warning: waiting for a token is the limit working as meant.
        log.info("task %s held back by rate limit %s/%s: next token in %.1f s",
                 task.task_id, *key, decision.retry_after_s)
        return False

    async def alert_short_circuit(self, cluster: str, pool: str, verdict: Verdict) -> None:
        """Raise the short-circuit alert once per episode (publish, then remember)."""
        ttl_s = self.settings.short_circuit_alert_ttl_s
        if not await self.safety.start_alert_episode(cluster, pool, ttl_s):
            return
        key = short_circuit_alert_key(cluster, pool)
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid4(), source=SOURCE, occurred_at=self.clock(), cluster_id=cluster,
            subject=key, severity="critical", kind="short_circuit", dedup_key=key,
            message=short_text(f"automation held back on pool {pool}: {verdict.reason}"),
        ))
        await self.safety.mark_alerted(cluster, pool, ttl_s)
        log.warning("alert: short-circuit on %s/%s: %s", cluster, pool, verdict.reason)

    async def on_pool_health(self, health: PoolHealth) -> None:
        """Keep the latest health of each pool, for the short-circuit and the budget.

        Health dated ahead of the clock is refused: kept, it would count as the newest for
        as long as it is ahead, shadowing every genuine report, so one forged `all healthy`
        would turn the short-circuit off."""
        ahead_s = (health.occurred_at - self.clock()).total_seconds()
        if ahead_s > self.settings.future_skew_s:
            raise PermanentError("future_dated", f"pool health of {health.cluster_id}/"
                                 f"{health.pool} is dated {ahead_s:.0f} s ahead of the clock")
        if await self.safety.save_health(health):
            await self._end_short_circuit(health)

    async def _end_short_circuit(self, health: PoolHealth) -> None:
        """A fresh report of a pool that admits disruptive work again ends its short-circuit
        episode and resolves its alert (once: the episode's mark is deleted first)."""
        kinds = self.settings.breaker_disruptive_kinds
        verdict = safety.short_circuit(
            health, kinds[0] if kinds else "offline", health.occurred_at,
            self.settings.pool_health_max_age_s,
            self.settings.short_circuit_unhealthy_fraction, kinds)
        cluster, pool = health.cluster_id, health.pool
        if not verdict.allowed or not await self.safety.end_alert_episode(cluster, pool):
            return
        key = short_circuit_alert_key(cluster, pool)
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid5(ids.SHORT_CIRCUIT_ENDS, f"{key}:{health.event_id}"), source=SOURCE,
            occurred_at=health.occurred_at, cluster_id=cluster, subject=key,
            severity="critical", kind="short_circuit", dedup_key=key, status="resolved",
            message=short_text(f"pool {pool} healthy again ({health.unhealthy_fraction:.0%} "
                               "unhealthy): automation resumes"),
        ))
        log.warning("alert resolved: short-circuit on %s/%s is over", cluster, pool)

    async def on_task_event(self, event: TaskEvent) -> None:
        """Feed a task's final outcome to its breaker (agent rejections excepted)."""
        if event.state in FINAL_STATES:
            # Idempotent: a replayed final event finds the task no longer counted.
            await self.safety.finish(str(event.task_id), event.occurred_at.timestamp())
            if self.relations is not None:
                await self.relations.finished(event)
        if event.state not in FINAL_OUTCOMES:
            return
        task_id = str(event.task_id)
        where = await self._breaker_of_event(event)
        if where is None:
            return
        cluster, name = where
        if event.state == "failed" and event.outputs.get("cause") in NOT_COUNTED:
            log.info("outcome of task %s not counted by breaker %s/%s: it did not act (%s)",
                     task_id, cluster, name, event.reason)
            await self.breakers.release_trial(cluster, name, task_id)
            return
        recorded = await self.breakers.record(
            cluster, name, Outcome(task_id=task_id, failed=event.state == "failed"))
        if recorded is None:
            return  # a redelivered event, already counted
        before, after = recorded
        if after.status != before.status:
            log.warning("breaker %s/%s %s -> %s after task %s %s", cluster, name,
                        before.status, after.status, task_id, event.state)
        if after.status == "OPEN":
            await self.alert_open(cluster, name, after)
        elif after.status == "CLOSED" and before.status != "CLOSED":
            await self.resolve_open(cluster, name, after, task_id)

    async def resolve_open(self, cluster: str, name: str, state: BreakerState,
                           task_id: str) -> None:
        """Resolve the breaker's open alert: its half-open trial succeeded."""
        key = breaker_alert_key(cluster, name)
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid5(ids.BREAKER_ALERTS, f"{key}:{state.openings}:closed"),
            source=SOURCE, occurred_at=self.clock(), cluster_id=cluster, subject=key,
            severity="info", kind="breaker_closed", dedup_key=key, status="resolved",
            message=short_text(f"circuit breaker for {name} on {cluster} closed: its trial "
                               f"task {task_id} succeeded"),
        ))

    async def _breaker_of_event(self, event: TaskEvent) -> tuple[str, str] | None:
        """(cluster, breaker name) of a final event's task, or None if it cannot be told.

        The index written when the task was queued is preferred: it alone knows the target,
        which the node scope needs. Without it the executor's outputs name the kind.
        """
        task_id = str(event.task_id)
        index = await self.breakers.task_index(task_id)
        if index is not None and index.breaker:
            return index.cluster, index.breaker
        if index is not None:
            cluster, kind, target = index.cluster, index.kind, index.target
        else:
            named = event.outputs.get("kind", event.outputs.get("need_kind"))
            if not isinstance(named, str):
                log.warning("outcome of task %s not counted: its kind is unknown", task_id)
                return None
            cluster, kind, target = event.cluster_id, named, ""
        scope = self.settings.scope_of(kind)
        if scope == "node" and not target:
            log.warning("outcome of task %s not counted: its target is unknown (node-scoped "
                        "breakers)", task_id)
            return None
        return cluster, breaker_name(kind, target, scope)

    async def alert_open(self, cluster: str, name: str, state: BreakerState) -> None:
        """Raise the breaker-open alert once per opening (publish, then remember)."""
        if await self.breakers.alerted(cluster, name, state.openings):
            return
        key = breaker_alert_key(cluster, name)
        # The event id is fixed per opening, so two schedulers racing here publish one alert
        # as far as any deduplicating consumer is concerned.
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid5(ids.BREAKER_ALERTS, f"{key}:{state.openings}"),
            source=SOURCE, occurred_at=self.clock(), cluster_id=cluster, subject=key,
            severity="critical", kind="breaker_open", dedup_key=key,
            message=short_text(
                f"circuit breaker {name} on {cluster} ({breakers.scope_of(name)} scope) is "
                f"open after {sum(state.window)} failure(s) of the last {len(state.window)} "
                f"within {self.settings.breaker_window_s:.0f} s; "
                f"{stopped_what(cluster, name)} are stopped until it closes"),
        ))
        await self.breakers.mark_alerted(cluster, name, state.openings)
        log.warning("alert: breaker %s/%s open (opening %d)", cluster, name, state.openings)
