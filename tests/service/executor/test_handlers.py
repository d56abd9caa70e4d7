"""The executor's handlers against the real redis-server at REDIS_URL, with a bus that
records what is published and a scripted centre: steps, guards, centre actions and child
tasks, retries with backoff, and recovery of unanswered commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from common.errors import PermanentError
from common.reportauth import WRONG_SENDER
from common.signing import ensure_keypair, signer_from_file, unb64url
from schemas.envelope import Envelope
from schemas.events.v1 import (
    AddCapacity,
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    MigrateJobs,
    OfflineNode,
    OpsTask,
    OutputValue,
    Step,
    StepAction,
    TaskControl,
    TaskEvent,
    TaskScheduled,
    now_utc,
)
from schemas.topics import Topic
from services.executor.broker_health import BrokerProbe, always_reachable
from services.executor.commands import command_id_for
from services.executor.handlers import Executor
from services.executor.journal import Journal, Workflow
from services.executor.ports import (
    BackendSteps,
    CentreResult,
    Completed,
    Failed,
    GuardCheck,
    Waiting,
)
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys, text
from services.shared.vouchers import ControlVouchers, Dispatches

CLUSTER = "c1"
NODE = "n1"


# ---------------------------------------------------------------- fakes and harness


@dataclass
class FakeBus:
    """Records every published event."""

    published: list[tuple[Topic, Envelope]] = field(default_factory=list)

    async def publish(self, topic: Topic, event: Envelope) -> None:
        self.published.append((topic, event))


@dataclass
class SetClock:
    """The executor's clock: stands still (on a whole second) unless a test moves it."""

    now: datetime = field(default_factory=lambda: now_utc().replace(microsecond=0))

    def __call__(self) -> datetime:
        return self.now

    def ms(self) -> int:
        return int(self.now.timestamp() * 1000)


@dataclass
class FakeCentre:
    """Guards by step index (default: holds) and scripted results of centre actions."""

    guards: dict[int, GuardCheck] = field(default_factory=dict)
    results: dict[int, list[CentreResult]] = field(default_factory=dict)
    runs: list[tuple[str, int, UUID]] = field(default_factory=list)

    async def check_guard(self, task: OpsTask, step: Step) -> GuardCheck:
        return self.guards.get(step.index, GuardCheck(True, "holds"))

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        self.runs.append((str(task.task_id), index, command_id))
        queue = self.results.get(index) or [Completed({"done": True})]
        return queue.pop(0) if len(queue) > 1 else queue[0]


def make_task(*actions: StepAction, guards: dict[int, str] | None = None,
              parent: UUID | None = None, mutex: list[str] | None = None,
              max_attempts: int = 3, action_type: str | None = None) -> OpsTask:
    task_id = uuid4()
    guards = guards or {}
    return OpsTask(
        event_id=uuid4(), source="test", occurred_at=now_utc(), cluster_id=CLUSTER,
        subject=str(task_id), task_id=task_id, parent_task_id=parent, need_id=uuid4(),
        need_kind="offline", action_type=action_type, template="offline", target=NODE,
        priority=1, mutex_keys=mutex or [f"node.{NODE}"],
        steps=[Step(index=i, name=f"s{i}", action=a, guard=guards.get(i),  # type: ignore[arg-type]
                    max_attempts=max_attempts, timeout_s=30.0)
               for i, a in enumerate(actions)],
    )


def drain_offline(**kwargs: Any) -> OpsTask:
    return make_task(DrainNode(node_id=NODE), OfflineNode(node_id=NODE), **kwargs)


@dataclass
class Harness:
    """An executor on a fresh namespace, and helpers to drive it like the loop would."""

    executor: Executor
    journal: Journal
    bus: FakeBus
    centre: FakeCentre
    redis: Redis
    keys: Keys
    clock: SetClock
    epoch: int = 0

    async def dispatch(self, task: OpsTask) -> None:
        """What the scheduler does (`schedule`), then until the steps it started end."""
        await self.schedule(task)
        # Steps through a cluster's backend run beside the consumer: let them end.
        await self.executor.idle()

    async def control(self, control: TaskControl) -> None:
        """What the API does: vouch for an operator's control, publish it (to the executor)."""
        await ControlVouchers(self.redis, self.keys).vouch(control)
        await self.executor.on_control(control)

    async def schedule(self, task: OpsTask) -> None:
        """What the scheduler does: take the task's locks, then hand it over."""
        for key in task.mutex_keys:
            await self.redis.set(self.keys.lock(key), str(task.task_id))
        # The scheduler's counter (which a restart's new epoch also comes from), and its
        # record of the dispatch, which the executor checks.
        self.epoch = await Dispatches(self.redis, self.keys).issue(task, 600.0, self.clock())
        await self.executor.on_scheduled(TaskScheduled(
            event_id=uuid4(), source="scheduler", occurred_at=now_utc(), cluster_id=CLUSTER,
            subject=str(task.task_id), task=task, epoch=self.epoch))

    def commands(self) -> list[CommandPayload]:
        return [CommandPayload.model_validate_json(unb64url(e.payload))
                for t, e in self.bus.published
                if t == Topic.NODE_COMMANDS and isinstance(e, Command)]

    def last_command(self) -> CommandPayload:
        return self.commands()[-1]

    def events(self, task: OpsTask | None = None) -> list[TaskEvent]:
        return [e for t, e in self.bus.published
                if t == Topic.OPS_TASK_EVENTS and isinstance(e, TaskEvent)
                and (task is None or e.task_id == task.task_id)]

    def states(self, task: OpsTask) -> list[str]:
        """Each event of the task as state, or state/step:step_state for a step event."""
        return [e.state if e.step_state is None else f"{e.state}/{e.step_index}:{e.step_state}"
                for e in self.events(task)]

    def final(self, task: OpsTask) -> TaskEvent:
        return [e for e in self.events(task)
                if e.state in ("succeeded", "failed", "terminated") and e.step_state is None][-1]

    def published_tasks(self) -> list[OpsTask]:
        return [e for t, e in self.bus.published
                if t == Topic.OPS_TASKS and isinstance(e, OpsTask)]

    async def answer(self, payload: CommandPayload, outcome: str = "succeeded",
                     reason: str = "", outputs: dict[str, OutputValue] | None = None, *,
                     sender: str | None = None, cluster: str = CLUSTER) -> None:
        """The agent's answer (`sender`, `cluster`: as another node would send it)."""
        node = sender or payload.node_id
        await self.executor.on_result(CommandResult(
            event_id=uuid4(), source=f"agent-{node}", occurred_at=now_utc(),
            cluster_id=cluster, subject=node, command_id=payload.command_id,
            node_id=node, task_id=payload.task_id, step_index=payload.step_index,
            action=payload.action.action, outcome=outcome,  # type: ignore[arg-type]
            reason=reason, outputs=outputs or {}))

    async def wf(self, task: OpsTask) -> Workflow:
        wf = await self.journal.load(str(task.task_id))
        assert wf is not None
        return wf

    async def expire_deadline(self, task: OpsTask) -> None:
        """Move the task's deadline (and its journaled copy) into the past."""
        tid = str(task.task_id)
        await self.redis.zadd(self.keys.workflow_deadlines(), {tid: 1})
        await self.redis.hset(self.keys.workflow(tid), "deadline_ms", 1)

    async def retry_due_now(self, task: OpsTask) -> None:
        await self.redis.zadd(self.keys.workflow_retries(), {str(task.task_id): 1})

    async def retry_now(self, task: OpsTask) -> None:
        """The task's retry made due and run by the deadline sweep, to the end of any step it
        runs through a backend (those run beside the consumer)."""
        await self.retry_due_now(task)
        await self.executor.sweep_deadlines()
        await self.executor.idle()

    async def lock_owner(self, key: str) -> str | None:
        value = await self.redis.get(self.keys.lock(key))
        return text(value) if value else None




def make_harness(redis: Redis, keys: Keys, tmp_path: Path,
                 settings: ExecutorSettings | None = None,
                 backends: BackendSteps | None = None,
                 broker_probe: BrokerProbe = always_reachable) -> Harness:
    """An executor on the real Redis with a fake bus and a fake centre (and, if given, the
    clusters' backends and the probe of the broker's reachability)."""
    private, _ = ensure_keypair(tmp_path / "keys", "executor")
    journal = Journal(redis, keys)
    bus, centre, clock = FakeBus(), FakeCentre(), SetClock()
    executor = Executor(settings or ExecutorSettings(), journal, signer_from_file(private), bus,
                        redis, keys, centre, clock=clock, backends=backends,
                        broker_probe=broker_probe)
    return Harness(executor, journal, bus, centre, redis, keys, clock)


@pytest.fixture
def harness(redis: Redis, keys: Keys, tmp_path: Path) -> Harness:
    return make_harness(redis, keys, tmp_path, ExecutorSettings(
        backoff_base_s=1.0, backoff_max_s=30.0, status_query_timeout_s=5.0,
        max_status_queries=2))


# ---------------------------------------------------------------- steps and guards


async def test_steps_run_in_order_and_the_final_event_says_what_kind_of_task(
    harness: Harness,
) -> None:
    task = drain_offline(action_type="remove_node")
    await harness.dispatch(task)
    drain = harness.last_command()
    assert (drain.action.action, drain.command_id) == ("drain_node",
                                                       command_id_for(task.task_id, 0, 0))
    await harness.answer(drain, outputs={"mode": "draining"})
    offline = harness.last_command()
    assert offline.action.action == "offline_node"
    assert offline.seq > drain.seq
    await harness.answer(offline)
    assert harness.states(task) == ["running", "running/0:started", "running/0:completed",
                                    "running/1:started", "running/1:completed", "succeeded"]
    assert harness.events(task)[2].outputs == {"mode": "draining"}
    assert harness.final(task).outputs == {"need_kind": "offline", "kind": "remove_node"}
    assert await harness.lock_owner(f"node.{NODE}") is None


async def test_an_answer_from_another_node_than_the_commands_settles_nothing(
    harness: Harness,
) -> None:
    # Its MAC says which node sent it; the step says which node was asked. A node's key must
    # not pass (or fail) another node's drain.
    task = drain_offline()
    await harness.dispatch(task)
    drain = harness.last_command()
    for sender, cluster in (("node-999", CLUSTER), (drain.node_id, "another-cluster")):
        with pytest.raises(PermanentError) as refused:
            await harness.answer(drain, sender=sender, cluster=cluster)
        assert refused.value.reason == WRONG_SENDER
    assert harness.states(task) == ["running", "running/0:started"]
    assert (await harness.wf(task)).step_state == "started"
    await harness.answer(drain)
    assert harness.last_command().action.action == "offline_node"


async def test_a_step_whose_guard_does_not_hold_is_skipped_with_the_reason(
    harness: Harness,
) -> None:
    task = make_task(DrainNode(node_id=NODE), AddCapacity(pool="default"),
                     OfflineNode(node_id=NODE), AddCapacity(pool="default"),
                     guards={1: "pool_above_range", 3: "pool_above_range"})
    harness.centre.guards = {1: GuardCheck(False, "pool at 55% is inside 20-80%"),
                             3: GuardCheck(False, "pool at 50% is inside 20-80%")}
    await harness.dispatch(task)
    await harness.answer(harness.last_command())
    # Step 1 is skipped, step 2 is sent straight away.
    assert harness.last_command().action.action == "offline_node"
    skipped = harness.events(task)[3]
    assert (skipped.step_index, skipped.step_state) == (1, "skipped")
    assert "pool at 55% is inside 20-80%" in skipped.reason
    assert skipped.outputs["guard"] == "pool_above_range"
    await harness.answer(harness.last_command())
    # The last step is skipped too: the task has succeeded.
    assert harness.states(task)[-2:] == ["running/3:skipped", "succeeded"]
    assert harness.centre.runs == []


async def test_a_centre_action_runs_in_the_executor_and_its_outputs_join_the_step(
    harness: Harness,
) -> None:
    task = make_task(AddCapacity(pool="default"))
    harness.centre.results = {0: [Completed({"initial_nodes": 5, "target_nodes": 6,
                                             "added_nodes": "standby-1"})]}
    await harness.dispatch(task)
    assert harness.commands() == []
    assert harness.centre.runs == [(str(task.task_id), 0, command_id_for(task.task_id, 0, 0))]
    completed = harness.events(task)[2]
    assert completed.step_state == "completed"
    assert completed.outputs == {"initial_nodes": 5, "target_nodes": 6,
                                 "added_nodes": "standby-1"}
    assert harness.final(task).state == "succeeded"


# ---------------------------------------------------------------- child tasks


def migrate_child(parent: OpsTask, job: str) -> OpsTask:
    return make_task(DrainNode(node_id=f"dst-{job}"), parent=parent.task_id,
                     mutex=[f"job.{job}", f"node.dst-{job}"], action_type="migrate")


async def test_a_waiting_step_ends_when_its_last_child_does(harness: Harness) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE), DrainNode(node_id=NODE))
    kids = [migrate_child(parent, "j1"), migrate_child(parent, "j2")]
    harness.centre.results = {0: [Waiting(kids, {"moves": "j1,j2"})]}
    await harness.dispatch(parent)
    # Each child is announced (created, with the task) and handed to the scheduler.
    assert harness.published_tasks() == kids
    created = [e for e in harness.events() if e.state == "created"]
    assert [e.task for e in created] == kids
    assert all(e.parent_task_id == parent.task_id for e in created)
    waiting = harness.events(parent)[-1]
    assert (waiting.step_state, waiting.outputs["children"]) == ("started", 2)
    parent_wf = await harness.wf(parent)
    assert (parent_wf.step_state, parent_wf.waiting) == ("started", 2)

    await harness.dispatch(kids[0])
    await harness.answer(harness.last_command())
    assert (await harness.wf(parent)).step == 0  # one child left
    await harness.dispatch(kids[1])
    await harness.answer(harness.last_command())
    done = next(e for e in harness.events(parent) if e.step_state == "completed")
    assert done.outputs == {"moves": "j1,j2", "children": 2, "succeeded": 2, "failed": 0}
    assert harness.last_command().action == DrainNode(node_id=NODE)  # the next parent step
    assert harness.final(kids[0]).outputs["kind"] == "migrate"


async def test_a_failed_child_fails_the_parent_step_for_good(harness: Harness) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE), DrainNode(node_id=NODE))
    kids = [migrate_child(parent, "j1"), migrate_child(parent, "j2")]
    harness.centre.results = {0: [Waiting(kids)]}
    await harness.dispatch(parent)
    await harness.dispatch(kids[0])
    await harness.answer(harness.last_command(), "failed", "not_drained")  # permanent
    assert harness.final(kids[0]).outputs["cause"] == "failed"
    await harness.dispatch(kids[1])
    await harness.answer(harness.last_command())
    final = harness.final(parent)
    assert (final.state, final.outputs["cause"]) == ("failed", "children_failed")
    assert "1 of 2 child tasks failed" in final.reason
    assert len(harness.centre.runs) == 1  # not retried: the children made their attempts
    assert await harness.lock_owner(f"node.{NODE}") is None


async def test_a_rerun_after_every_child_finished_ends_the_step_at_once(
    harness: Harness,
) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE))
    kid = migrate_child(parent, "j1")
    harness.centre.results = {0: [Waiting([kid])]}
    await harness.dispatch(parent)
    wf = await harness.wf(parent)
    await harness.journal.child_done(wf, str(kid.task_id), "succeeded")
    # The parent's deadline passes with the last notice lost: the sweep settles it.
    await harness.expire_deadline(parent)
    await harness.executor.sweep_deadlines()
    assert harness.final(parent).state == "succeeded"


async def test_children_still_open_at_the_deadline_are_published_again_once(
    harness: Harness,
) -> None:
    parent = make_task(MigrateJobs(pool="default", node_id=NODE))
    kid = migrate_child(parent, "j1")
    harness.centre.results = {0: [Waiting([kid])]}
    await harness.dispatch(parent)
    await harness.expire_deadline(parent)
    await harness.executor.sweep_deadlines()
    # The same children again (the scheduler dedupes them), and more time.
    assert harness.published_tasks() == [kid, kid]
    assert len(harness.centre.runs) == 2
    assert len({run[2] for run in harness.centre.runs}) == 1  # under the same command id
    assert (await harness.wf(parent)).step_state == "started"
    await harness.expire_deadline(parent)
    await harness.executor.sweep_deadlines()
    final = harness.final(parent)
    assert (final.state, final.outputs["cause"]) == ("failed", "timeout")
    assert "1 of 1 child tasks still open" in final.reason
    assert len(harness.centre.runs) == 2  # permanent: not retried


async def test_a_task_dispatched_again_after_it_ended_gives_back_the_locks(
    harness: Harness,
) -> None:
    task = make_task(DrainNode(node_id=NODE))
    await harness.dispatch(task)
    await harness.answer(harness.last_command())
    assert harness.final(task).state == "succeeded"
    await harness.dispatch(task)  # e.g. requeued by the scheduler's reaper, newer epoch
    assert await harness.lock_owner(f"node.{NODE}") is None
    assert len(harness.commands()) == 1


def scheduled(task: OpsTask, epoch: int) -> TaskScheduled:
    return TaskScheduled(event_id=uuid4(), source="scheduler", occurred_at=now_utc(),
                         cluster_id=CLUSTER, subject=str(task.task_id), task=task, epoch=epoch)


async def test_a_dispatch_the_scheduler_never_made_is_refused_and_nothing_runs(
    harness: Harness,
) -> None:
    # Anyone on the broker can publish a dispatch: one the scheduler did not record.
    forged = make_task(DrainNode(node_id=NODE))
    with pytest.raises(PermanentError, match="no dispatch of task"):
        await harness.executor.on_scheduled(scheduled(forged, 7))
    # A genuine task, then a copy of it with a changed step, and its dispatch with an epoch
    # the scheduler never issued (one of 2^63-1 would fence the node's commands for good).
    genuine = make_task(DrainNode(node_id=NODE))
    await harness.dispatch(genuine)
    changed = genuine.model_copy(update={"steps": [
        genuine.steps[0].model_copy(update={"timeout_s": 3_000.0})]})
    with pytest.raises(PermanentError, match="differs from the one dispatched"):
        await harness.executor.on_scheduled(scheduled(changed, harness.epoch))
    with pytest.raises(PermanentError, match="was never issued"):
        await harness.executor.on_scheduled(scheduled(genuine, 2**63 - 1))
    assert [c.task_id for c in harness.commands()] == [genuine.task_id]
    assert await harness.journal.load(str(forged.task_id)) is None


async def test_an_earlier_dispatch_redelivered_after_a_newer_one_is_ignored_as_stale(
    harness: Harness,
) -> None:
    task = make_task(DrainNode(node_id=NODE))
    await harness.dispatch(task)
    first = harness.epoch
    await harness.dispatch(task)  # dispatched again (the reaper), a newer epoch recorded
    await harness.executor.on_scheduled(scheduled(task, first))  # no error: stale
    assert len(harness.commands()) == 1


async def test_a_task_whose_lock_another_task_took_does_not_act_again(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    # The lock lapsed while the drain ran and another task took the node.
    await harness.redis.set(harness.keys.lock(f"node.{NODE}"), "someone-else")
    await harness.answer(harness.last_command())
    final = harness.final(task)
    assert final.state == "failed"
    assert "lock_lost: lock node." in (final.reason or "")
    assert [c.action.action for c in harness.commands()] == ["drain_node"]  # no offline
    assert await harness.lock_owner(f"node.{NODE}") == "someone-else"  # left to its owner


async def test_a_running_tasks_locks_are_renewed_and_a_finished_ones_are_not(
        harness: Harness) -> None:
    running, done = drain_offline(), make_task(DrainNode(node_id="node-xyz"),
                                               mutex=["node.node-xyz"])
    await harness.dispatch(running)
    await harness.dispatch(done)
    await harness.answer(harness.commands()[-1])  # `done` ends: its lock is released
    lock = harness.keys.lock(f"node.{NODE}")
    await harness.redis.pexpire(lock, 1_000)  # about to lapse
    await harness.executor.renew_locks()
    assert await harness.redis.pttl(lock) > 60_000
    assert await harness.lock_owner("node.node-xyz") is None


# ---------------------------------------------------------------- failures and retries


async def test_a_transient_failure_is_retried_with_exponential_backoff(
    harness: Harness,
) -> None:
    task = drain_offline()
    tid = str(task.task_id)
    await harness.dispatch(task)
    first = harness.last_command()
    await harness.answer(first, "failed", "injected_failure")
    due = await harness.redis.zscore(harness.keys.workflow_retries(), tid)
    assert due == harness.clock.ms() + 1_000
    assert "retry in 1 s" in harness.events(task)[-1].reason
    # Not before it is due...
    await harness.executor.sweep_deadlines()
    assert harness.last_command() == first
    # ...then a new attempt with its own command id, and a longer wait after it fails.
    await harness.retry_now(task)
    second = harness.last_command()
    assert second.command_id == command_id_for(task.task_id, 0, 1)
    await harness.answer(second, "failed", "injected_failure")
    due = await harness.redis.zscore(harness.keys.workflow_retries(), tid)
    assert due == harness.clock.ms() + 2_000
    await harness.retry_now(task)
    await harness.answer(harness.last_command(), "failed", "injected_failure")
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", "failed")
    assert "no attempt left" in harness.events(task)[-2].reason
    assert await harness.lock_owner(f"node.{NODE}") is None


@pytest.mark.parametrize(
    ("outcome", "reason", "cause"),
    [("rejected", "expired", "rejected"), ("failed", "not_drained", "failed"),
     ("failed", "job_not_here", "failed"), ("rejected", "stale_epoch", "rejected")],
)
async def test_permanent_failures_are_not_retried(harness: Harness, outcome: str, reason: str,
                                                  cause: str) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    await harness.answer(harness.last_command(), outcome, reason)
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", cause)
    assert len(harness.commands()) == 1
    assert await harness.journal.due_retries(10**15) == []


async def test_a_late_answer_to_an_abandoned_attempt_changes_nothing(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    first = harness.last_command()
    await harness.answer(first, "failed", "injected_failure")
    await harness.retry_now(task)
    await harness.answer(first, "succeeded")  # the first attempt's answer, too late
    wf = await harness.wf(task)
    assert (wf.step, wf.attempt, wf.step_state) == (0, 1, "started")


async def test_a_centre_failure_marked_permanent_is_not_retried(harness: Harness) -> None:
    task = make_task(AddCapacity(pool="default"))
    harness.centre.results = {0: [Failed("no_destination: pool is full", permanent=True)]}
    await harness.dispatch(task)
    assert harness.final(task).outputs["cause"] == "failed"
    assert len(harness.centre.runs) == 1


# ---------------------------------------------------------------- recovery


async def overdue_with_query(harness: Harness, task: OpsTask) -> CommandPayload:
    await harness.dispatch(task)
    await harness.expire_deadline(task)
    await harness.executor.sweep_deadlines()
    query = harness.last_command()
    assert query.action.action == "query_status"
    return query


async def test_an_unanswered_command_is_asked_about_and_its_answer_counts(
    harness: Harness,
) -> None:
    task = drain_offline()
    query = await overdue_with_query(harness, task)
    drain = harness.commands()[0]
    assert query.action.command_id == drain.command_id  # type: ignore[union-attr]
    assert query.command_id != drain.command_id
    assert query.seq == 0
    await harness.answer(query, "succeeded", outputs={
        "queried_command_id": str(drain.command_id), "queried_action": "drain_node",
        "mode": "draining"})
    completed = next(e for e in harness.events(task) if e.step_state == "completed")
    assert completed.outputs == {"mode": "draining"}
    assert harness.last_command().action.action == "offline_node"


async def test_a_command_the_agent_never_got_is_sent_again_with_its_id(
    harness: Harness,
) -> None:
    task = drain_offline()
    query = await overdue_with_query(harness, task)
    drain = harness.commands()[0]
    await harness.answer(query, "unknown", "not_in_journal",
                         {"queried_command_id": str(drain.command_id)})
    resent = harness.last_command()
    assert resent.command_id == drain.command_id
    assert resent.seq > drain.seq
    await harness.answer(resent)
    assert harness.last_command().action.action == "offline_node"


async def test_a_command_still_in_progress_gets_more_time(harness: Harness) -> None:
    task = drain_offline()
    query = await overdue_with_query(harness, task)
    drain = harness.commands()[0]
    await harness.answer(query, "unknown", "in_progress",
                         {"queried_command_id": str(drain.command_id)})
    wf = await harness.wf(task)
    assert wf.step_state == "started"
    assert wf.deadline_ms == harness.clock.ms() + 30_000
    assert "deadline extended" in harness.events(task)[-1].reason
    # Queries are bounded (2 here): the second deadline asks again, the third gives up.
    await harness.expire_deadline(task)
    await harness.executor.sweep_deadlines()
    second = harness.last_command()
    assert second.action.action == "query_status"
    assert second.command_id != query.command_id
    await harness.answer(second, "unknown", "in_progress",
                         {"queried_command_id": str(drain.command_id)})
    await harness.expire_deadline(task)
    await harness.executor.sweep_deadlines()
    failed = harness.events(task)[-1]
    assert failed.step_state == "failed"
    assert "timeout" in failed.reason
    assert (await harness.wf(task)).attempt == 1  # a retry is scheduled


async def test_an_unanswered_query_fails_the_attempt_as_a_timeout(harness: Harness) -> None:
    task = drain_offline(max_attempts=1)
    await overdue_with_query(harness, task)
    await harness.expire_deadline(task)
    await harness.executor.sweep_deadlines()
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", "timeout")


async def test_a_refused_status_query_counts_as_a_timeout(harness: Harness) -> None:
    task = drain_offline()
    query = await overdue_with_query(harness, task)
    await harness.answer(query, "rejected", "expired")
    assert harness.events(task)[-1].outputs["cause"] == "timeout"
    assert (await harness.wf(task)).state == "running"  # transient: retried later


async def test_startup_recovery_asks_about_every_unanswered_command(harness: Harness) -> None:
    task = drain_offline()
    await harness.dispatch(task)
    drain = harness.last_command()
    # A fresh executor process (same Redis): its first sweep recovers.
    fresh = Executor(harness.executor.settings, harness.journal, harness.executor.signer,
                     harness.bus, harness.redis, harness.keys, harness.centre,
                     clock=harness.clock)
    await fresh.sweep_deadlines()
    query = harness.last_command()
    assert query.action.action == "query_status"
    assert query.action.command_id == drain.command_id
    await fresh.sweep_deadlines()
    assert harness.last_command() == query  # once


async def test_a_scheduled_step_nobody_started_is_started_by_the_sweep(
    harness: Harness,
) -> None:
    task = drain_offline()
    tid = str(task.task_id)
    # the starter died right after the journal
    await harness.journal.start(task, 1, 1, harness.clock.ms())
    await harness.executor.sweep_deadlines()
    assert harness.last_command().action.action == "drain_node"
    assert (await harness.wf(task)).step_state == "started"
    assert await harness.redis.zscore(harness.keys.workflow_deadlines(), tid) is not None


async def test_an_unfinished_centre_action_is_run_again_under_the_same_command_id(
    harness: Harness,
) -> None:
    task = make_task(AddCapacity(pool="default"))
    tid = str(task.task_id)
    await harness.journal.start(task, 1, 10**15, harness.clock.ms())
    wf = await harness.wf(task)
    command = command_id_for(task.task_id, 0, 0)
    await harness.journal.step_started(wf, str(command), 1)  # then the process died
    await harness.redis.zadd(harness.keys.workflow_deadlines(), {tid: 1})
    await harness.executor.sweep_deadlines()
    assert harness.centre.runs == [(tid, 0, command)]
    assert harness.final(task).state == "succeeded"
