"""Scheduler handlers: tasks in, queued; a dispatcher loop hands them to the executor."""

from __future__ import annotations

import logging
from uuid import NAMESPACE_URL, uuid4, uuid5

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
from services.scheduler import policy, safety
from services.scheduler.breaker import BreakerState, Outcome
from services.scheduler.breaker_store import BreakerStore
from services.scheduler.queue import TaskQueue
from services.scheduler.safety import Verdict
from services.scheduler.safety_store import SafetyStore
from services.scheduler.settings import SchedulerSettings
from services.shared.messaging import EventBus

log = logging.getLogger("clusterwarden.scheduler")
SOURCE = "scheduler"
_IDS = uuid5(NAMESPACE_URL, "clusterwarden/task-events")
_ALERT_IDS = uuid5(NAMESPACE_URL, "clusterwarden/breaker-alerts")
FINAL_OUTCOMES: frozenset[TaskState] = frozenset({"succeeded", "failed"})
# A terminated task fed no outcome to its breaker, but its node is back in the budget.
FINAL_STATES: frozenset[TaskState] = FINAL_OUTCOMES | {"terminated"}


def task_event(task: OpsTask, state: TaskState, previous: TaskState | None, reason: str,
               discriminator: str = "") -> TaskEvent:
    """A transition of `task`, with an id that is the same if the transition is replayed."""
    return TaskEvent(
        event_id=uuid5(_IDS, f"{task.task_id}:{state}:{discriminator}"),
        source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
        subject=str(task.task_id), correlation_id=str(task.need_id),
        task_id=task.task_id, parent_task_id=task.parent_task_id,
        state=state, previous_state=previous, actor=SOURCE, reason=reason,
    )


class Scheduler:
    """Queues every task once and dispatches the most urgent task whose targets are free."""

    def __init__(self, settings: SchedulerSettings, queue: TaskQueue, bus: EventBus,
                 breakers: BreakerStore, safety_store: SafetyStore) -> None:
        self.settings = settings
        self.queue = queue
        self.bus = bus
        self.breakers = breakers
        self.safety = safety_store

    async def on_task(self, task: OpsTask) -> None:
        # Indexed before queueing, so the task's outcome can always be tied to its breaker.
        await self.breakers.remember_task(task)
        new = await self.queue.enqueue(
            task, policy.queue_score(task), policy.lock_ttl_s(task, self.settings.lock_margin_s)
        )
        # Published even for a redelivered task: its id is fixed, so consumers dedupe it, and a
        # crash between the enqueue and this publish cannot lose the transition.
        await self.bus.publish(
            Topic.OPS_TASK_EVENTS, task_event(task, "queued", "created", "queued by priority")
        )
        if new:
            log.info("queued task %s (priority %s)", task.task_id, task.priority)

    async def dispatch(self) -> None:
        """One dispatcher tick: requeue expired leases, then dispatch what can run."""
        now_ms = int(now_utc().timestamp() * 1000)
        if reaped := await self.queue.reap(now_ms):
            log.warning("requeued %d task(s) whose dispatcher did not finish", reaped)
        lease_ms = int(self.settings.lease_s * 1000)
        held: list[str] = []
        try:
            await self._dispatch_claimed(now_ms, lease_ms, held)
        finally:
            # Held out of the ready queue until now, so one blocked task cannot be claimed
            # over and over in a tick; if this fails, the lease ends and the reaper requeues.
            for task_id in held:
                await self.breakers.requeue(task_id)

    async def _dispatch_claimed(self, now_ms: int, lease_ms: int, held: list[str]) -> None:
        """Claim and dispatch until nothing is free; tasks a breaker refuses go to `held`."""
        blocked: set[tuple[str, str]] = set()
        for _ in range(100):
            claimed = await self.queue.claim(now_ms, lease_ms, self.settings.scan_limit)
            if claimed is None:
                return
            task = claimed.task
            if not (await self._breaker_admits(task, blocked)
                    and await self._pool_admits(task)):
                await self.breakers.release_claim(task)
                held.append(str(task.task_id))
                continue
            if task.need_kind == "offline":
                # Counted before the dispatch is published: a crash in between over-counts
                # (safe, the entry lapses) rather than letting the pool lose one node too many.
                await self.safety.add_in_flight(
                    task, now_ms / 1000 + policy.lock_ttl_s(task, self.settings.lock_margin_s))
            epoch = await self.queue.next_epoch()
            # The transition first: once the executor has the task it publishes `running`,
            # and the task's events must arrive in the order they happened.
            await self.bus.publish(
                Topic.OPS_TASK_EVENTS,
                task_event(task, "dispatched", "queued", f"locks {task.mutex_keys} held; "
                           f"epoch {epoch}", str(epoch)),
            )
            await self.bus.publish(
                Topic.OPS_TASKS_SCHEDULED,
                TaskScheduled(
                    event_id=uuid5(_IDS, f"{task.task_id}:scheduled:{epoch}"),
                    source=SOURCE, occurred_at=now_utc(), cluster_id=task.cluster_id,
                    subject=str(task.task_id), correlation_id=str(task.need_id),
                    task=task, epoch=epoch,
                ),
            )
            await self.queue.ack(str(task.task_id))
            log.info("dispatched task %s with epoch %d", task.task_id, epoch)

    async def _breaker_admits(self, task: OpsTask, blocked: set[tuple[str, str]]) -> bool:
        """Ask the task's breaker (once per tick for a breaker that said no)."""
        key = (task.cluster_id, task.need_kind)
        if key in blocked:
            return False
        decision, state = await self.breakers.admit(*key, str(task.task_id))
        if decision.allowed:
            return True
        blocked.add(key)
        log.warning("task %s held back by breaker %s/%s: %s", task.task_id, *key,
                    decision.reason)
        if state is not None and state.status != "CLOSED":
            # Also here, not only where the breaker opened: an alert lost to a crash there is
            # raised by the next task the breaker holds back.
            await self.alert_open(*key, state)
        return False

    async def _pool_admits(self, task: OpsTask) -> bool:
        """The pool's short-circuit, then (for offline tasks) its offline budget."""
        now = now_utc()
        try:
            health = await self.safety.load_health(task.cluster_id, task.pool)
            in_flight = (await self.safety.in_flight(task.cluster_id, task.pool, now.timestamp())
                         if task.need_kind == "offline" else 0)
            target_state = (await self.safety.node_state(task.cluster_id, task.target)
                            if task.need_kind == "offline" else None)
        except Exception as err:
            # Fail closed: without the pool's health or its in-flight count nothing runs.
            log.warning("task %s held back: pool safety state unreadable: %r",
                        task.task_id, err)
            return False
        verdict = safety.short_circuit(
            health, task.need_kind, now, self.settings.pool_health_max_age_s,
            self.settings.short_circuit_unhealthy_fraction,
            self.settings.breaker_disruptive_kinds)
        if verdict.allowed and task.need_kind == "offline":
            verdict = safety.admits_offline(
                health, in_flight, self.settings.offline_budget_fraction,
                target_not_ready=target_state in safety.NOT_READY_STATES)
        if verdict.allowed:
            return True
        log.warning("task %s held back by pool %s/%s: %s", task.task_id, task.cluster_id,
                    task.pool, verdict.reason)
        if verdict.alert:
            await self.alert_short_circuit(task.cluster_id, task.pool, verdict)
        return False

    async def alert_short_circuit(self, cluster: str, pool: str, verdict: Verdict) -> None:
        """Raise the short-circuit alert once per episode (publish, then remember)."""
        ttl_s = self.settings.short_circuit_alert_ttl_s
        if not await self.safety.start_alert_episode(cluster, pool, ttl_s):
            return
        dedup_key = f"short-circuit.{cluster}.{pool}"
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid4(), source=SOURCE, occurred_at=now_utc(), cluster_id=cluster,
            subject=dedup_key, severity="critical", kind="short_circuit", dedup_key=dedup_key,
            message=f"automation held back on pool {pool}: {verdict.reason}"[:256],
        ))
        await self.safety.mark_alerted(cluster, pool, ttl_s)
        log.warning("alert: short-circuit on %s/%s: %s", cluster, pool, verdict.reason)

    async def on_pool_health(self, health: PoolHealth) -> None:
        """Keep the latest health of each pool, for the short-circuit and the budget."""
        await self.safety.save_health(health)

    async def on_task_event(self, event: TaskEvent) -> None:
        """Feed a task's final outcome to the breaker of its cluster and need kind."""
        if event.state in FINAL_STATES:
            # Idempotent: a replayed final event finds the task no longer counted.
            await self.safety.finish(str(event.task_id), event.occurred_at.timestamp())
        if event.state not in FINAL_OUTCOMES:
            return
        task_id = str(event.task_id)
        kind = event.outputs.get("need_kind")
        cluster = event.cluster_id
        if not isinstance(kind, str):
            indexed = await self.breakers.task_kind(task_id)
            if indexed is None:
                log.warning("outcome of task %s not counted: its need kind is unknown", task_id)
                return
            cluster, kind = indexed
        recorded = await self.breakers.record(
            cluster, kind, Outcome(task_id=task_id, failed=event.state == "failed"))
        if recorded is None:
            return  # a redelivered event, already counted
        before, after = recorded
        if after.status != before.status:
            log.warning("breaker %s/%s %s -> %s after task %s %s", cluster, kind,
                        before.status, after.status, task_id, event.state)
        if after.status == "OPEN":
            await self.alert_open(cluster, kind, after)

    async def alert_open(self, cluster: str, kind: str, state: BreakerState) -> None:
        """Raise the breaker-open alert once per opening (publish, then remember)."""
        if await self.breakers.alerted(cluster, kind, state.openings):
            return
        dedup_key = f"breaker.{cluster}.{kind}"
        # The event id is fixed per opening, so two schedulers racing here publish one alert
        # as far as any deduplicating consumer is concerned.
        await self.bus.publish(Topic.OPS_ALERTS, Alert(
            event_id=uuid5(_ALERT_IDS, f"{dedup_key}:{state.openings}"),
            source=SOURCE, occurred_at=now_utc(), cluster_id=cluster, subject=dedup_key,
            severity="critical", kind="breaker_open", dedup_key=dedup_key,
            message=(f"circuit breaker for {kind} on {cluster} is open after "
                     f"{sum(state.window)} failure(s) in the last {len(state.window)}; "
                     f"automation of {kind} is stopped"),
        ))
        await self.breakers.mark_alerted(cluster, kind, state.openings)
        log.warning("alert: breaker %s/%s open (opening %d)", cluster, kind, state.openings)
