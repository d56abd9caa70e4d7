"""The router's handlers: ML tasks in, a decision and a signed command out, outcomes back.

Each task is a small durable state machine in Redis (services/router/records.py), moved on
by `advance`, which any router instance may run at any time: on a submission, on an
agent's answer, or from the sweep when a task is due (an attempt's deadline, a wait). Every
step is one optimistic transaction over the task's record and the statistics it touches,
so two instances never both count an outcome or both take an arm's last slot; events leave
through the record's outbox after the step committed.

    routing --select--> running --answer / timeout--> (statistics) --> succeeded
       ^  \\--nothing to take now--> waiting                    \\--> retry: routing
       |                                  \\--deadline--> failed   \\--> failed
       \\------------------------------------------------------------/
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID, uuid4

from opentelemetry import trace
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from common.clock import EpochClock
from common.errors import PermanentError
from common.messaging import EventBus
from common.reportauth import WRONG_SENDER
from common.signing import CommandSigner
from common.tracing import current_trace, resumed_span
from schemas.catalog import TOPIC_MODELS
from schemas.envelope import Envelope, short_text
from schemas.events.v1 import CommandResult, InferenceCause, MlTaskSubmitted, NodeReport
from schemas.topics import Topic
from services.router.decisions import (
    POLICY_CAUSE,
    SOURCE,
    cause_of,
    command_id_for,
    decision_attributes,
    epoch,
    inference_payload,
    outcome_event,
    policy_task,
    selection_event,
)
from services.router.metrics import record_published
from services.router.policy.selector import (
    Attempt,
    Decision,
    RetryBudget,
    commit,
    retry_plan,
    select,
    snapshot_keys,
)
from services.router.policy.stats import Outcome, record_keys
from services.router.policy.updates import record
from services.router.records import (
    AttemptRecord,
    AttemptResult,
    Outbound,
    TaskRecord,
    record_ttl_s,
)
from services.router.registry import (
    Registry,
    bounded,
    candidates,
    policy_model,
    served_arms,
    split_model,
)
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore, begin_writes, is_arm, optimistic
from services.shared.breaker_holds import StoppedNodes
from services.shared.demand import ML_TASKS, report_demand
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.router")
_tracer = trace.get_tracer("clusterwarden.router")

# progress: look again; idle: wait for something; flush: publish the outbox, then wait.
Step = Literal["progress", "idle", "flush"]
# ended: by this answer; not_pending: ended before, or no such attempt; wrong_sender: another
# node's answer.
AttemptEnd = Literal["ended", "not_pending", "wrong_sender"]
MAX_STEPS = 16
SWEEP_BATCH = 100
CLAIM_LEASE_S = 10.0
# KEYS: the due set. ARGV: now, the lease's end, how many. Due members, moved to the lease end.
_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""
# KEYS: the task's record, the active set of its type, the due set. ARGV: the fresh record,
# its TTL, the task id, its deadline, its first due time. Creates the record unless it
# exists, and then enters the task in both sets; 1 if it did.
_CREATE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[3])
return 1
"""


@dataclass
class _Turn:
    """Who is moving one task on in this instance, and who waits."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class Router:
    """Routes the ML tasks of every cluster whose events it receives."""

    def __init__(self, settings: RouterSettings, redis: Redis, keys: Keys, bus: EventBus,
                 signer: CommandSigner, registry: Registry, stats: StatsStore, *,
                 rng: random.Random | None = None,
                 clock: EpochClock = time.time) -> None:
        self.settings = settings
        self.config = settings.policy
        self.redis = redis
        self.keys = keys
        self.bus = bus
        self.signer = signer
        self.registry = registry
        self.stats = stats
        self.rng = rng or random.Random()
        self.clock = clock
        # Nodes an open node-scoped circuit breaker stops get no ML task (read once a second).
        self.stopped = StoppedNodes(redis, keys, cache_s=settings.breaker_cache_s, clock=clock)
        self._claim = redis.register_script(_CLAIM)
        self._create = redis.register_script(_CREATE)
        self._turns: dict[UUID, _Turn] = {}
        self._demand_pools: dict[str, set[str]] = {}  # per cluster: pools given demand

    # ------------------------------------------------------------ handlers

    async def on_submitted(self, task: MlTaskSubmitted) -> None:
        """A new task (or a redelivered one: its record exists, and it is only advanced)."""
        # In the submission's trace, which the record keeps for the sweep and the answers.
        fresh = TaskRecord(task=task, trace_context=current_trace())
        # The record, the task's entry among the active ones and, a safety net (if this
        # handler dies from here on, the sweep takes the task over), its due time: at once.
        created = await self._create(
            keys=[self.keys.ml_task(str(task.task_id)),
                  self.keys.ml_active(task.cluster_id, task.task_type), self.keys.ml_due()],
            args=[fresh.model_dump_json(), self.settings.record_ttl_s, str(task.task_id),
                  epoch(task.deadline), self.clock() + CLAIM_LEASE_S])
        if created:
            log.info("task %s (%s, priority %d) submitted by %s", task.task_id,
                     task.task_type, task.priority, task.submitted_by)
        await self.advance(task.task_id)

    async def on_result(self, result: CommandResult) -> None:
        """An agent's answer to a run_inference command ends its attempt (once)."""
        if result.action != "run_inference" or result.task_id is None:
            return
        if result.outcome == "unknown":
            return  # "in progress": the real answer follows
        inference = result.inference
        ended = AttemptResult(
            cause=cause_of(result), ended_at=self.clock(),
            node_latency_ms=inference.latency_ms if inference else None,
            prediction=inference.prediction if inference else None,
            confidence=inference.confidence if inference else None,
            detail=short_text(inference.detail if inference and inference.detail
                              else result.reason))
        async with self._one_at_a_time(result.task_id):
            verdict = await self._end_attempt(result.task_id, result.command_id, ended,
                                              sender=(result.cluster_id, result.node_id))
            if verdict == "ended":
                await self._advance(result.task_id)
        if verdict == "wrong_sender":
            # Sealed by a node (its MAC), but not by the one the attempt went to: one node's
            # key must not end another's attempts (a failure would count against its arm).
            raise PermanentError(WRONG_SENDER, f"answer from {result.cluster_id}/"
                                 f"{result.node_id} to an attempt sent elsewhere")

    async def on_report(self, report: NodeReport) -> None:
        """A node's report feeds the model registry."""
        await self.registry.update(report)

    async def sweep(self) -> None:
        """Advance every task that is due.

        Claimed with a lease (its due time moved `CLAIM_LEASE_S` ahead, in one script): one
        instance takes each, and a task whose instance died on it comes back when the lease
        ends instead of being lost.
        """
        now = self.clock()
        claimed = await self._claim(keys=[self.keys.ml_due()],
                                    args=[now, now + CLAIM_LEASE_S, SWEEP_BATCH])
        for member in claimed:
            task_id = UUID(text(member))
            try:
                await self.advance(task_id)
            except Exception:
                # Looked at again when the lease ends; the other due tasks go on.
                log.exception("advancing task %s failed", task_id)

    async def report_demand(self) -> None:
        """Report the waiting tasks of every cluster as queued demand, per pool (one router
        instance per period); waiting entries past their task's deadline are dropped."""
        period = self.settings.demand_period_s
        if not await self.redis.set(self.keys.sweep_lock("ml-demand"), b"1", nx=True,
                                    px=int(period * 900)):
            return
        now = self.clock()
        for cluster in sorted(text(c) for c in await self.redis.smembers(self.keys.clusters())):
            waiting = await self.redis.hgetall(self.keys.ml_waiting(cluster))
            counts, stale = waiting_by_pool(waiting, now)
            if stale:
                await self.redis.hdel(self.keys.ml_waiting(cluster), *stale)
            # Every pool reported before gets its new figure, 0 included, so demand ends
            # when the tasks do, not only when the entry times out.
            pools = sorted(set(counts) | self._demand_pools.get(cluster, set()))
            self._demand_pools[cluster] = set(counts)
            for pool in pools:
                n = counts.get(pool, 0)
                await report_demand(self.redis, self.keys, cluster, pool, ML_TASKS, items=n,
                                    gpus=n * self.settings.task_gpus, now=now,
                                    ttl_s=3 * period)

    # ------------------------------------------------------------ the state machine

    async def advance(self, task_id: UUID) -> None:
        """Move the task on until it waits for something (an answer, a deadline, a slot)."""
        async with self._one_at_a_time(task_id):
            await self._advance(task_id)

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, task_id: UUID) -> AsyncIterator[None]:
        """This instance moves each task on in one place at a time.

        Correct without it (every step is a transaction), but an answer that arrives while
        the submission's handler is still sending the command would otherwise make both
        publish the outbox and conflict on the record. Other instances are not waited for.
        """
        turn = self._turns.get(task_id)
        if turn is None:
            turn = self._turns[task_id] = _Turn()
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[task_id]

    async def _advance(self, task_id: UUID) -> None:
        for _ in range(MAX_STEPS):
            step = await self._step(task_id)
            if step == "flush":
                rec = await self._load(self.redis, task_id)
                if rec is not None and rec.outbox:
                    await self._flush(task_id, rec)
                return
            if step == "idle":
                return
        # Not expected; looked at again soon rather than spinning here.
        await self._due(task_id, self.clock())

    async def _load(self, reader: Redis | Pipeline, task_id: UUID) -> TaskRecord | None:
        raw = await reader.get(self.keys.ml_task(str(task_id)))
        return None if raw is None else TaskRecord.model_validate_json(raw)

    def _save(self, pipe: Pipeline, record: TaskRecord) -> None:
        pipe.set(self.keys.ml_task(str(record.task.task_id)), record.model_dump_json(),
                 ex=record_ttl_s(record, self.clock(), self.settings.finished_record_ttl_s,
                                 self.settings.record_ttl_s))

    async def _due(self, task_id: UUID, when: float) -> None:
        await self.redis.zadd(self.keys.ml_due(), {str(task_id): when})

    async def _step(self, task_id: UUID) -> Step:
        rec = await self._load(self.redis, task_id)
        if rec is None:
            await self.redis.zrem(self.keys.ml_due(), str(task_id))
            return "idle"
        # Whoever moves the task on (its submission, an answer, the sweep), it is a step of
        # the submission's trace.
        with resumed_span(_tracer, "router.step", rec.trace_context,
                          attributes=rec.span_attributes()) as span:
            step = await self._step_on(task_id, rec)
            span.set_attribute("ml.step", step)
            return step

    async def _step_on(self, task_id: UUID, rec: TaskRecord) -> Step:
        if rec.outbox:
            await self._flush(task_id, rec)
            return "progress"
        now = self.clock()
        task = rec.task
        if rec.final:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self.keys.ml_active(task.cluster_id, task.task_type), str(task_id))
                pipe.zrem(self.keys.ml_due(), str(task_id))
                pipe.hdel(self.keys.ml_waiting(task.cluster_id), str(task_id))
                await pipe.execute()
            return "idle"
        current = rec.current
        if rec.state == "running" and current is not None:
            if current.state == "dispatched":
                if now >= current.deadline:
                    await self._end_attempt(task_id, current.command_id, AttemptResult(
                        cause="timeout", ended_at=now,
                        detail=f"no answer within {current.deadline - current.decided_at:.3g} s"))
                    return "progress"
                await self._due(task_id, current.deadline)
                return "idle"
            if not current.stats_recorded:
                await self._conclude(task_id, current, task)
                return "progress"
        if rec.state in ("routing", "waiting"):
            if now >= epoch(task.deadline) - self.settings.min_attempt_s:
                await self._expire(task_id)
                return "progress"
            return await self._route(task_id, task)
        return "idle"

    async def _flush(self, task_id: UUID, rec: TaskRecord) -> None:
        """Publish the outbox (in the submission's trace), then take what was published
        out of it."""
        sent = list(rec.outbox)
        with resumed_span(_tracer, "router.publish", rec.trace_context,
                          attributes=rec.span_attributes()):
            for out in sent:
                event = TOPIC_MODELS[out.topic].model_validate_json(out.body)
                await self.bus.publish(out.topic, event)
                record_published(event)

        async def body(pipe: Pipeline) -> None:
            latest = await self._load(pipe, task_id)
            begin_writes(pipe)
            if latest is not None and latest.outbox[: len(sent)] == sent:
                latest.outbox = latest.outbox[len(sent):]
                self._save(pipe, latest)

        await optimistic(self.redis, [self.keys.ml_task(str(task_id))], body)

    async def _end_attempt(self, task_id: UUID, command_id: UUID, result: AttemptResult, *,
                           sender: tuple[str, str] | None = None) -> AttemptEnd:
        """Mark an attempt ended with `result`, unless it ended already (or `sender`, the
        (cluster, node) that answered, is not the attempt's node): `ended` if it did now."""
        key = self.keys.ml_task(str(task_id))

        async def body(pipe: Pipeline) -> AttemptEnd:
            rec = await self._load(pipe, task_id)
            attempt = rec.attempt_of(command_id) if rec is not None else None
            begin_writes(pipe)
            if rec is None or attempt is None or attempt.state != "dispatched":
                return "not_pending"
            if sender is not None and sender != (rec.task.cluster_id, attempt.node):
                return "wrong_sender"
            attempt.state, attempt.result = "ended", result
            self._save(pipe, rec)
            if attempt.retry:
                pipe.zrem(self.keys.ml_retrying(rec.task.cluster_id, rec.task.task_type),
                          f"{task_id}:{attempt.n}")
            return "ended"

        ended = await optimistic(self.redis, [key], body)
        if ended == "ended":
            log.info("task %s attempt on %s: %s", task_id, command_id,
                     result.cause or "succeeded")
        return ended

    async def _budget(self, cluster: str, task_type: str, now: float) -> RetryBudget:
        """Retries in flight and unfinished tasks of the type (stale entries pruned)."""
        active = self.keys.ml_active(cluster, task_type)
        retrying = self.keys.ml_retrying(cluster, task_type)
        async with self.redis.pipeline(transaction=False) as pipe:  # one round trip
            pipe.zremrangebyscore(active, "-inf", now - self.settings.attempt_timeout_s)
            pipe.zremrangebyscore(retrying, "-inf", now)
            pipe.zcard(retrying)
            pipe.zcard(active)
            _, _, retries, tasks = await pipe.execute()
        return RetryBudget(retries_in_flight=int(retries), active_tasks=int(tasks))

    async def _conclude(self, task_id: UUID, ended: AttemptRecord,
                        task: MlTaskSubmitted) -> None:
        """Count an ended attempt in the statistics and decide: done, retry or failed.

        `task` is the record's task as the caller read it (it never changes)."""
        task_key = self.keys.ml_task(str(task_id))
        model = policy_model(ended.model, ended.version)
        now = self.clock()
        cluster = task.cluster_id
        # A change point on the model or the node rewrites every arm of it that `record`
        # is given: load (and watch) all the served arms sharing either, of any task type
        # (a node's change concerns all its models), not only the arm the outcome ran on.
        stat_keys = record_keys(model, ended.node, ended.family, ended.predecessor,
                                served_arms(await self.registry.entries(cluster, now)))
        budget = await self._budget(cluster, task.task_type, now)

        async def body(pipe: Pipeline) -> None:
            rec = await self._load(pipe, task_id)
            attempt = rec.current if rec is not None else None
            if (rec is None or attempt is None or attempt.command_id != ended.command_id
                    or attempt.state != "ended" or attempt.stats_recorded
                    or attempt.result is None):
                begin_writes(pipe)
                return
            before = await self.stats.read(pipe, cluster, stat_keys)
            cause = attempt.result.cause
            outcome = Outcome(model=model, node=attempt.node, family=attempt.family,
                              cause=POLICY_CAUSE[cause] if cause else "ok",
                              latency_s=max(attempt.result.ended_at - attempt.decided_at, 0.0),
                              predecessor=attempt.predecessor, dispatched=True)
            after = record(before, outcome, now, self.config)
            attempt.stats_recorded = True
            self._decide_next(rec, attempt, budget, now)
            begin_writes(pipe)
            self.stats.write(pipe, cluster, before, after)
            self._save(pipe, rec)

        await optimistic(self.redis, [task_key, *self.stats.redis_keys(cluster, stat_keys)],
                         body)

    def _decide_next(self, rec: TaskRecord, attempt: AttemptRecord, budget: RetryBudget,
                     now: float) -> None:
        """After an attempt ended: succeeded, another attempt, or failed (in `rec`)."""
        result = attempt.result
        assert result is not None  # the caller checked
        cause = result.cause
        where = f"{attempt.model}:{attempt.version} on {attempt.node}"
        if cause is None:
            rec.state = "succeeded"
            reason = f"{where} answered {result.prediction}"
            self._emit(rec, Topic.ML_TASKS_OUTCOMES, outcome_event(
                rec, attempt, final=True, state="succeeded", reason=reason, occurred=now))
            return
        tried = [Attempt(model=policy_model(a.model, a.version), node=a.node, family=a.family,
                         cause=POLICY_CAUSE[a.result.cause] if a.result and a.result.cause
                         else "ok")
                 for a in rec.attempts if a.state == "ended"]
        plan = retry_plan(policy_task(rec), POLICY_CAUSE[cause], tried, budget, now=now,
                          config=self.config)
        left = epoch(rec.task.deadline) - now
        if plan.retry and left > self.settings.min_attempt_s:
            rec.state, rec.next_attempt = "routing", attempt.n + 1
            rec.avoid, rec.wait_status = plan.avoid.to_dict(), None
            self._emit(rec, Topic.ML_TASKS_OUTCOMES, outcome_event(
                rec, attempt, final=False, state="running",
                reason=f"{where}: {cause} ({result.detail}); {plan.reason}", occurred=now))
            return
        rec.state = "failed"
        why = plan.reason if plan.retry is False else "no retry: too close to the deadline"
        self._emit(rec, Topic.ML_TASKS_OUTCOMES, outcome_event(
            rec, attempt, final=True, state="failed",
            reason=f"{where}: {cause} ({result.detail}); {why}", occurred=now))

    async def _expire(self, task_id: UUID) -> None:
        """A task still waiting for an attempt at its deadline fails (nobody's fault)."""

        async def body(pipe: Pipeline) -> None:
            rec = await self._load(pipe, task_id)
            begin_writes(pipe)
            if rec is None or rec.state not in ("routing", "waiting") or rec.outbox:
                return
            now = self.clock()
            cause: InferenceCause
            if rec.wait_status == "no_candidates":
                cause, why = "no_candidates", "no model serving the task type was ready"
            elif rec.wait_status == "saturated":
                cause, why = "capacity", "every model was at its concurrency limit"
            else:
                cause, why = "deadline_too_short", "no time left for an attempt"
            rec.state = "failed"
            self._emit(rec, Topic.ML_TASKS_OUTCOMES, outcome_event(
                rec, None, final=True, state="failed", cause=cause,
                reason=f"deadline passed: {why}", occurred=now))
            self._save(pipe, rec)
            pipe.hdel(self.keys.ml_waiting(rec.task.cluster_id), str(task_id))

        await optimistic(self.redis, [self.keys.ml_task(str(task_id))], body)

    async def _route(self, task_id: UUID, task: MlTaskSubmitted) -> Step:
        """Select the next attempt's arm and send it the task, or wait.

        `task` is the record's task as the caller read it (it never changes)."""
        cluster = task.cluster_id
        now = self.clock()
        stopped = await self.stopped.of(cluster)
        entries = [e for e in await self.registry.entries(cluster, now) if e.node not in stopped]
        found = bounded(
            candidates(entries, task.task_type, now, self.settings.fallbacks,
                       self.settings.registry_stale_after_s),
            self.settings.max_candidates, self.rng)
        by_arm = {c.arm: c for c in found}
        stat_keys = snapshot_keys(found)
        arm_keys = [k for k in stat_keys if is_arm(k)]
        # Only the arms are watched; levels are read with them (one round trip) but without
        # watching them: a decision only changes arms, and a level a little stale changes an
        # estimate a little (it is recorded with the decision).
        watch = [self.keys.ml_task(str(task_id)), *self.stats.redis_keys(cluster, arm_keys)]
        # The decision that committed, with its attempt (a retried transaction decides again).
        made: list[tuple[Decision, int]] = []

        async def body(pipe: Pipeline) -> Step:
            rec = await self._load(pipe, task_id)
            if rec is None or rec.state not in ("routing", "waiting") or rec.outbox:
                begin_writes(pipe)
                return "progress"
            snapshot = await self.stats.read(pipe, cluster, stat_keys)
            decision = select(policy_task(rec), found, snapshot, now, self.rng, self.config)
            n = rec.next_attempt
            chosen = decision.chosen
            made[:] = [(decision, n)]
            if chosen is None:
                rec.state = "waiting"
                step: Step = "idle"
                if decision.status != rec.wait_status:
                    rec.wait_status = decision.status
                    self._emit(rec, Topic.ML_DECISIONS,
                               selection_event(decision, rec.task, n, None, uuid4()))
                    step = "flush"
                begin_writes(pipe)
                self._save(pipe, rec)
                pipe.zadd(self.keys.ml_due(), {str(task_id): now + self.settings.wait_retry_s})
                # Queued demand: waiting until a model can take it (or its deadline).
                pipe.hset(self.keys.ml_waiting(cluster), str(task_id),
                          f"{self.settings.demand_pool}|{epoch(rec.task.deadline):.3f}")
                return step
            name, version = split_model(chosen.model)
            deadline = min(epoch(rec.task.deadline), now + self.settings.attempt_timeout_s)
            attempt = AttemptRecord(
                n=n, model=name, version=version, family=chosen.family, node=chosen.node,
                predecessor=by_arm[chosen.arm].predecessor,
                command_id=command_id_for(task_id, n), decided_at=now, deadline=deadline,
                retry=n > 1)
            command = self.signer.sign(inference_payload(rec.task, attempt, now), SOURCE)
            rec.attempts.append(attempt)
            rec.state, rec.wait_status = "running", None
            self._emit(rec, Topic.ML_DECISIONS,
                       selection_event(decision, rec.task, n, attempt.command_id, uuid4()))
            self._emit(rec, Topic.NODE_COMMANDS, command)
            begin_writes(pipe)
            self.stats.write(pipe, cluster, snapshot, commit(snapshot, decision, self.config))
            self._save(pipe, rec)
            pipe.hdel(self.keys.ml_waiting(cluster), str(task_id))
            if attempt.retry:
                pipe.zadd(self.keys.ml_retrying(cluster, rec.task.task_type),
                          {f"{task_id}:{n}": deadline})
            # Looked at again at the attempt's deadline, or sooner if the outbox is still
            # unsent then (the next step moves it to the deadline once it is sent).
            pipe.zadd(self.keys.ml_due(), {str(task_id): min(deadline, now + CLAIM_LEASE_S)})
            log.info("task %s attempt %d -> %s:%s on %s (%s: %s)", task_id, n, name, version,
                     chosen.node, decision.status, decision.reason)
            return "progress"

        # The routing decision is a span of the submission's trace (the step's child).
        with _tracer.start_as_current_span("router.decision") as span:
            step = await optimistic(self.redis, watch, body)
            for decision, n in made:
                span.set_attributes(decision_attributes(decision, task_id, n, len(found)))
            return step

    @staticmethod
    def _emit(rec: TaskRecord, topic: Topic, event: Envelope) -> None:
        """Put an event in the record's outbox (sent once the change has committed)."""
        rec.outbox.append(Outbound(topic=topic, body=event.model_dump_json()))


def waiting_by_pool(waiting: Mapping[bytes | str, bytes | str],
                    now: float) -> tuple[dict[str, int], list[str]]:
    """(waiting tasks per pool, task ids whose deadline has passed) of a waiting index."""
    counts: dict[str, int] = {}
    stale: list[str] = []
    for task_id, value in waiting.items():
        pool, _, deadline = text(value).rpartition("|")
        if float(deadline or 0) < now:
            stale.append(text(task_id))
        else:
            counts[pool] = counts.get(pool, 0) + 1
    return counts, stale
