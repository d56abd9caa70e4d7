"""Test helpers of the scheduler tests: a hand-moved clock, tasks, events and a recording bus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

from common.messaging import EventBus
from schemas.envelope import Envelope
from schemas.events.v1 import (
    AddCapacity,
    MigrateJobs,
    NodeStateName,
    OnlineNode,
    OpsTask,
    OutputValue,
    PoolHealth,
    Step,
    StepAction,
    TaskEvent,
    TaskState,
    now_utc,
)
from schemas.topics import Topic
from tests.contracts.examples import example


class Clock:
    """A clock the test moves by hand (epoch seconds)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def utc(self) -> datetime:
        """The same time as an aware datetime (a `Clock`, where the stores take epoch seconds)."""
        return datetime.fromtimestamp(self.now, UTC)


class RecordingBus(EventBus):
    """An EventBus that keeps what is published instead of sending it."""

    def __init__(self) -> None:  # no broker: nothing is sent
        self.published: list[tuple[Topic, Envelope]] = []

    async def publish(self, topic: Topic, event: Envelope) -> None:
        self.published.append((topic, event))

    def on(self, topic: Topic) -> list[Envelope]:
        return [event for t, event in self.published if t is topic]


_last_occurred_at = datetime.min.replace(tzinfo=UTC)


def _next_occurred_at() -> datetime:
    """Now, and always at least a millisecond after the task made before: the queue serves
    tasks of one priority by their millisecond of `occurred_at`, and two tasks made within
    one millisecond would be served in the order of their random ids."""
    global _last_occurred_at
    _last_occurred_at = max(now_utc(), _last_occurred_at + timedelta(milliseconds=1))
    return _last_occurred_at


def steps_of(kind: str | None, target: str, pool: str) -> list[Step] | None:
    """What a task of `kind` does (None: the offline example's drain and offline): the
    scheduler's pool limits judge a task by its steps."""
    actions: dict[str, StepAction] = {
        "online": OnlineNode(node_id=target), "migrate": MigrateJobs(pool=pool, node_id=target),
        "scale_out": AddCapacity(pool=pool)}
    action = actions.get(kind or "")
    return None if action is None else [Step(index=0, name=kind or "step", action=action)]


def task(target: str, kind: str | None = None, cluster: str = "local",
         pool: str = "default") -> OpsTask:
    """An offline task for `target` (or, with `kind`, a child task of that action type,
    doing what that kind does), made after every task made before it."""
    task_id = uuid4()
    base = example("ops_task", OpsTask)
    update: dict[str, object] = {
        "event_id": uuid4(), "occurred_at": _next_occurred_at(), "cluster_id": cluster,
        "subject": str(task_id), "task_id": task_id, "need_id": uuid4(), "target": target,
        "pool": pool, "mutex_keys": [f"node.{target}"], "action_type": kind}
    if (steps := steps_of(kind, target, pool)) is not None:
        update["steps"] = steps
    return base.model_copy(update=update)


def final_event(task_id: UUID, state: TaskState, cause: str | None = None,
                cluster: str = "local", *, at: datetime, **outputs: OutputValue) -> TaskEvent:
    """The executor's final event of a task at `at`; a failure carries its `cause`."""
    if cause is not None:
        outputs["cause"] = cause
    return TaskEvent(
        event_id=uuid4(), source="executor", occurred_at=at, cluster_id=cluster,
        subject=str(task_id), task_id=task_id, state=state, previous_state="running",
        actor="executor", reason=f"task {state}", outputs=outputs)


def pool_health(states: dict[NodeStateName, int], at: datetime, cluster: str = "local",
                pool: str = "default", age_s: float = 0.0) -> PoolHealth:
    """A pool's health as the analyzer would publish it at `at`."""
    total = sum(states.values())
    counted = total - states.get("offline", 0)
    unhealthy = states.get("suspect", 0) + states.get("down", 0)
    return PoolHealth(
        event_id=uuid4(), source="analyzer", occurred_at=at - timedelta(seconds=age_s),
        cluster_id=cluster, subject=pool, pool=pool, nodes_total=total, nodes_by_state=states,
        unhealthy_fraction=unhealthy / counted if counted else 0.0, gpu_utilization_pct=50.0,
        effective_utilization_pct=50.0)
