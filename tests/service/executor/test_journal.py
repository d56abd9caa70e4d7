"""The step journal's compare-and-set scripts against the real redis-server at REDIS_URL.

Each test uses a fresh key namespace.
"""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID, uuid4

import pytest
from redis.asyncio import Redis

from schemas.events.v1 import DrainNode, OfflineNode, OpsTask, Step, StepAction, now_utc
from services.executor.journal import FinalNotice, Journal, Patch, PauseRequest, Workflow
from services.shared.redis_client import Keys, members

NOW_MS = 1_800_000_000_000
FINAL = FinalNotice("succeeded", "running", "every step completed")


@pytest.fixture
def journal(redis: Redis, keys: Keys) -> Journal:
    return Journal(redis, keys)


def make_task(steps: int = 2) -> OpsTask:
    task_id = uuid4()
    actions: list[StepAction] = [DrainNode(node_id="n1"), OfflineNode(node_id="n1")]
    return OpsTask(
        event_id=uuid4(), source="test", occurred_at=now_utc(), cluster_id="c1",
        subject=str(task_id), task_id=task_id, need_id=uuid4(), need_kind="offline",
        template="offline", target="n1", priority=1, mutex_keys=["node.n1"],
        steps=[Step(index=i, name=f"s{i}", action=actions[i % 2]) for i in range(steps)],
    )


async def reload(journal: Journal, task_id: str) -> Workflow:
    wf = await journal.load(task_id)
    assert wf is not None
    return wf


async def started(journal: Journal, task: OpsTask, command: str = "c0") -> Workflow:
    assert (await journal.start(task, 1, 10**15, NOW_MS))[0] == "new"
    wf = await reload(journal, str(task.task_id))
    assert await journal.step_started(wf, command, 10**12)
    return await reload(journal, str(task.task_id))


async def test_start_is_once_per_epoch_and_a_newer_epoch_takes_over(journal: Journal) -> None:
    task = make_task()
    assert await journal.start(task, 3, 0, NOW_MS) == ("new", None)
    assert await journal.start(task, 3, 0, NOW_MS) == ("stale", None)
    assert await journal.start(task, 2, 0, NOW_MS) == ("stale", None)
    assert await journal.start(task, 4, 0, NOW_MS) == ("takeover", None)
    wf = await reload(journal, str(task.task_id))
    assert (wf.epoch, wf.state, wf.step, wf.step_state, wf.run) == (4, "running", 0,
                                                                   "scheduled", 0)


async def test_a_step_starts_once_and_only_where_the_workflow_is(journal: Journal,
                                                                 redis: Redis,
                                                                 keys: Keys) -> None:
    task = make_task()
    await journal.start(task, 1, 5, NOW_MS)
    wf = await reload(journal, str(task.task_id))
    assert await journal.overdue(5) == [str(task.task_id)]  # the "start it by" timer
    assert await journal.step_started(wf, "c0", 1_000)
    assert not await journal.step_started(wf, "c0", 1_000)  # a racing duplicate
    assert await journal.task_of_command("c0") == str(task.task_id)
    assert await redis.zscore(keys.workflow_deadlines(), str(task.task_id)) == 1_000
    assert not await journal.step_started(replace(wf, attempt=1), "c1", 1_000)


async def test_step_end_moves_on_retries_later_and_finishes(journal: Journal, redis: Redis,
                                                            keys: Keys) -> None:
    task = make_task()
    tid = str(task.task_id)
    wf = await started(journal, task)
    # A transient failure: the retry waits in the retries ZSET, the deadline is gone.
    ended = await journal.step_ended(wf, "failed", FINAL, NOW_MS, retry_at_ms=777, reason="r",
                                     cause="failed")
    assert ended.boundary == "retry"
    assert await journal.due_retries(777) == [tid]
    assert await redis.zscore(keys.workflow_deadlines(), tid) is None
    # The same end again is stale (the command is no longer current).
    again = await journal.step_ended(wf, "failed", FINAL, NOW_MS, retry_at_ms=777)
    assert again.boundary == "stale"
    wf = await reload(journal, tid)
    assert (wf.attempt, wf.step_state) == (1, "scheduled")
    assert await journal.step_started(wf, "c1", 10**12)
    assert await journal.due_retries(10**13) == []
    wf = await reload(journal, tid)
    ended = await journal.step_ended(wf, "completed", FINAL, NOW_MS,
                                     outputs={"mode": "draining"}, kick_ms=99)
    assert ended.boundary == "next"
    assert await redis.zscore(keys.workflow_deadlines(), tid) == 99
    wf = await reload(journal, tid)
    assert (wf.step, wf.attempt, wf.outputs) == (1, 0, {"0": {"mode": "draining"}})
    assert await journal.step_started(wf, "c2", 10**12)
    wf = await reload(journal, tid)
    assert await journal.unannounced(NOW_MS) == []
    ended = await journal.step_ended(wf, "completed", FINAL, NOW_MS,
                                     reason="every step completed")
    assert ended.boundary == "succeeded"
    wf = await reload(journal, tid)
    assert (wf.state, wf.reason) == ("succeeded", "every step completed")
    # The final state and the announcement it owes are one unit, until it is announced.
    assert wf.final == FINAL
    assert await journal.unannounced(NOW_MS - 1) == []
    assert await journal.unannounced(NOW_MS) == [tid]
    await journal.announced(tid)
    assert await journal.unannounced(NOW_MS) == []
    assert (await reload(journal, tid)).final is None
    assert 0 < await redis.ttl(keys.workflow(tid)) <= 604_800
    assert await journal.overdue(10**13) == []


async def test_a_final_failure_keeps_its_cause(journal: Journal) -> None:
    task = make_task()
    wf = await started(journal, task)
    final = FinalNotice("failed", "running", "step s0: rejected expired", cause="rejected",
                        run=0, step=0)
    ended = await journal.step_ended(wf, "failed", final, NOW_MS,
                                     reason="step s0: rejected expired", cause="rejected")
    assert ended.boundary == "failed"
    loaded = await journal.load(str(task.task_id))
    assert loaded is not None
    assert (loaded.state, loaded.step_state, loaded.cause) == ("failed", "failed", "rejected")
    assert loaded.final == final
    assert await journal.unannounced(NOW_MS) == [str(task.task_id)]


async def test_a_requested_pause_stops_the_workflow_at_the_step_boundary(
    journal: Journal,
) -> None:
    task = make_task()
    wf = await started(journal, task)
    request = PauseRequest("alice", "look first", "k1")
    assert await journal.transition(wf, "k1", Patch(pause=request)) == "applied"
    wf = await reload(journal, str(task.task_id))
    assert (wf.state, wf.pause) == ("running", request)
    ended = await journal.step_ended(wf, "completed", FINAL, NOW_MS)
    assert ended.boundary == "paused"
    assert ended.pause is not None
    assert ended.pause.actor == "alice"
    wf = await reload(journal, str(task.task_id))
    assert (wf.state, wf.step, wf.step_state, wf.pause) == ("paused", 1, "scheduled", None)
    assert await journal.overdue(10**15) == []


async def test_a_transition_applies_only_to_the_version_read_and_only_once(
    journal: Journal,
) -> None:
    task = make_task()
    wf = await started(journal, task)
    assert await journal.transition(wf, "k1", Patch(state="paused"),
                                    timers="clear") == "applied"
    assert await journal.transition(wf, "k2", Patch(state="running")) == "changed"
    fresh = await journal.load(str(task.task_id))
    assert fresh is not None
    assert await journal.transition(fresh, "k1", Patch(state="running")) == "duplicate"
    assert await journal.control_seen(str(task.task_id), "k1")


async def test_a_control_for_an_unknown_task_waits_for_it(journal: Journal) -> None:
    task = make_task()
    tid = str(task.task_id)
    assert await journal.keep_pending(tid, "k1", "pause", "alice", "hold it") == "ok"
    assert await journal.keep_pending(tid, "k1", "pause", "alice", "hold it") == "duplicate"
    pending = await journal.pending_control(tid)
    assert pending is not None
    assert (pending.action, pending.actor) == ("pause", "alice")
    outcome, applied = await journal.start(task, 1, 0, NOW_MS)
    assert outcome == "paused"
    assert applied is not None
    assert (applied.actor, applied.reason) == ("alice", "hold it")
    assert await journal.pending_control(tid) is None
    assert await journal.overdue(10**15) == []  # a paused workflow has no timer
    assert await journal.keep_pending(tid, "k2", "terminate", "bob", "no") == "exists"


async def test_a_terminate_kept_for_an_unknown_task_ends_it_on_arrival(
    journal: Journal,
) -> None:
    task = make_task()
    tid = str(task.task_id)
    await journal.keep_pending(tid, "k1", "terminate", "bob", "not needed")
    outcome, _ = await journal.start(task, 1, 0, NOW_MS)
    assert outcome == "terminated"
    wf = await reload(journal, tid)
    assert (wf.state, wf.cause) == ("terminated", "terminated")
    # Its end is owed from the moment it is journaled, with what the operator said.
    assert wf.final == FinalNotice("terminated", "dispatched", "terminate: not needed",
                                   cause="terminated", actor="bob")
    assert await journal.unannounced(NOW_MS) == [tid]


async def test_status_queries_are_counted_and_answered_once(journal: Journal,
                                                             keys: Keys) -> None:
    task = make_task()
    wf = await started(journal, task)
    assert await journal.recovery_started(wf, "q0", 5_000, max_queries=2)
    assert not await journal.recovery_started(wf, "q0", 5_000, max_queries=2)  # outstanding
    assert await journal.task_of_command("q0") == f"query:{task.task_id}"
    wf = await reload(journal, str(task.task_id))
    assert (wf.queries, wf.query_id, wf.deadline_ms) == (1, "q0", 5_000)
    assert await journal.query_answered(wf, 9_000, resend=True)
    wf = await reload(journal, str(task.task_id))
    assert (wf.query_id, wf.resent, wf.deadline_ms) == ("", 1, 9_000)
    assert await journal.recovery_started(wf, "q1", 5_000, max_queries=2)
    wf = await reload(journal, str(task.task_id))
    assert not await journal.query_answered(wf, 9_000, resend=True)  # resent once already
    assert await journal.query_answered(wf, 9_000, resend=False)
    wf = await reload(journal, str(task.task_id))
    assert not await journal.recovery_started(wf, "q2", 5_000, max_queries=2)  # used up


async def test_children_are_counted_until_the_last_one_finishes(journal: Journal) -> None:
    task = make_task()
    wf = await started(journal, task)
    kids = [str(uuid4()) for _ in range(3)]
    counts = await journal.await_children(wf, kids, {"initial_nodes": 5})
    assert counts is not None
    assert (counts.children, counts.finished) == (3, 0)
    # The same command records the same children again without forgetting outcomes.
    wf = await reload(journal, str(task.task_id))
    assert (wf.waiting, wf.waiting_outputs) == (3, {"initial_nodes": 5})
    first = await journal.child_done(wf, kids[0], "succeeded")
    assert first is not None
    assert not first.settled
    assert await journal.child_done(wf, str(uuid4()), "succeeded") is None  # not a child
    again = await journal.await_children(wf, kids, {})
    assert again is not None
    assert again.finished == 1
    assert await journal.open_children(str(task.task_id), 0) == sorted(kids[1:])
    await journal.child_done(wf, kids[1], "failed")
    last = await journal.child_done(wf, kids[2], "succeeded")
    assert last is not None
    assert last.settled
    assert last.failed == 1


async def test_an_old_workflow_without_the_new_fields_is_still_read(journal: Journal,
                                                                    redis: Redis,
                                                                    keys: Keys) -> None:
    task = make_task()
    tid = str(task.task_id)
    await redis.hset(keys.workflow(tid), mapping={
        "epoch": 1, "task": task.model_dump_json(), "state": "running", "step": 0,
        "attempt": 0, "step_state": "scheduled", "command_id": "", "outputs": "{}"})
    wf = await reload(journal, tid)
    assert (wf.run, wf.version, wf.pause) == (0, 0, None)
    assert await journal.step_started(wf, str(UUID(int=1)), 10**12)
    assert members(await redis.zrange(keys.workflow_deadlines(), 0, -1)) == [tid]
