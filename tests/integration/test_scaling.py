"""Capacity in both directions on the real broker, Redis and agent processes: a pool held above
its range gets the standby node and moves work onto it; held below its range it drains and
removes a node (the provider's own) without losing a job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from aiokafka import AIOKafkaProducer

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import (
    MlTaskSubmitted,
    NodeReport,
    OpsNeed,
    OpsTask,
    PoolHealth,
    TaskEvent,
    now_utc,
)
from schemas.topics import Topic
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register, registered_nodes
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    is_up,
    name,
    services,
    stack_env,
    tap,
    until,
)

pytestmark = pytest.mark.timeout(600)

FLEET = ["node-001", "node-002"]
STANDBY = "standby-1"
POOL = "default"
FINAL = ("succeeded", "failed", "terminated")


def task_events(events: Tap) -> list[TaskEvent]:
    return [TaskEvent.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]


def plans(events: Tap) -> dict[UUID, OpsTask]:
    """Every task seen so far (its `created` event carries the plan), by id."""
    return {e.task_id: e.task for e in task_events(events) if e.task is not None}


def of_task(events: Tap, task_id: UUID) -> list[TaskEvent]:
    return [e for e in task_events(events) if e.task_id == task_id]


def children_of(events: Tap, parent: UUID) -> list[OpsTask]:
    return [t for t in plans(events).values() if t.parent_task_id == parent]


def final_state(events: Tap, task_id: UUID) -> str | None:
    return next((e.state for e in of_task(events, task_id) if e.state in FINAL), None)


def need_task(events: Tap, need_kind: str) -> OpsTask | None:
    """The (first) top-level task made for a need of `need_kind`."""
    return next((t for t in plans(events).values()
                 if t.need_kind == need_kind and t.parent_task_id is None), None)


def trail(events: Tap, task_id: UUID) -> str:
    """A task's events, one line each, for failure messages."""
    return "\n".join(f"{e.state} {e.step_index} {e.step_state} {e.reason} {dict(e.outputs)}"
                     for e in of_task(events, task_id))


def completed_outputs(events: Tap, task_id: UUID, action: str) -> dict[str, object]:
    """The outputs of the task's completed step whose action is `action`."""
    plan = plans(events)[task_id]
    for event in of_task(events, task_id):
        if (event.step_state == "completed" and event.step_index is not None
                and plan.steps[event.step_index].action.action == action):
            return dict(event.outputs)
    raise AssertionError(f"no completed {action} step of {task_id}:\n{trail(events, task_id)}")


def latest_reports(events: Tap) -> dict[str, NodeReport]:
    """The newest report of each node seen so far."""
    latest: dict[str, NodeReport] = {}
    for record in events.records:
        if not record.topic.endswith(Topic.NODE_REPORTS.value):
            continue
        report = NodeReport.model_validate_json(record.value)
        seen = latest.get(report.node_id)
        if seen is None or report.seq > seen.seq:
            latest[report.node_id] = report
    return latest


def running_jobs(events: Tap, nodes: list[str]) -> dict[str, str]:
    """job id -> node, for the jobs the latest reports of `nodes` show running."""
    reports = latest_reports(events)
    return {job.job_id: node for node in nodes if node in reports
            for job in reports[node].jobs if job.state == "running"}


def set_load(state_dir: Path, nodes: list[str], pct: float) -> None:
    for node in nodes:
        fleet.inject_fault(state_dir, node, load_pct=pct)


async def test_a_pool_scales_out_and_rebalances_then_scales_in_without_losing_a_job(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        # Two simulated jobs per node (training and inference, no processes): each is half
        # of its node's load, so one can move without making a new hot spot.
        AGENT_JOBS="sim:train,infer",
        ANALYZER_ENABLED_NEEDS='["scale"]', ANALYZER_SCALE__HOLD_S="3",
        ANALYZER_POOL_PERIOD_S="1",
        CAPACITY_PROVIDER="local", CAPACITY_LOCAL_STANDBY=f"{STANDBY}:2",
        CAPACITY_LOCAL_JOBS="sim:", CAPACITY_LOCAL_INTERVAL_S="1",
        CAPACITY_READY_TIMEOUT_S="90",
        SCHEDULER_RATE_PER_S="10",
        **SMALL_POOL_SAFETY,
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    # Held above the range (80 %) from the first report.
    set_load(tmp_path, FLEET, 90.0)
    async with services(env, tmp_path):
        await register(redis_url, namespace, "itest", FLEET)
        # One GPU each: the standby node (2 GPUs) is bigger than the pool's nodes.
        fleet.fleet_up(len(FLEET), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.NODE_REPORTS, namespace)) as watch:
                for node in FLEET:
                    await watch.wait_for(is_up(node), 90, f"{node} up")

                # ---- above the range: scale out, then rebalance onto the new node
                await watch.wait_for(lambda _: need_task(watch, "scale_out") is not None, 120,
                                     "a scale_out task")
                out = need_task(watch, "scale_out")
                assert out is not None
                await watch.wait_for(lambda _: final_state(watch, out.task_id) is not None,
                                     240, "the scale_out task to finish")
                assert final_state(watch, out.task_id) == "succeeded", trail(watch, out.task_id)
                assert [s.action.action for s in out.steps] == ["add_capacity", "migrate_jobs"]
                assert out.steps[1].guard == "nodes_out_of_range"

                added = completed_outputs(watch, out.task_id, "add_capacity")
                assert (added["nodes"], added["added"], added["direction"]) == (
                    STANDBY, 1, "out"), added
                assert (added["initial_nodes"], added["target_nodes"]) == (2, 3), added
                assert (added["initial_gpus"], added["target_gpus"]) == (2, 4), added
                assert float(str(added["initial_util_pct"])) > 80.0, added
                assert 25.0 <= float(str(added["target_util_pct"])) <= 75.0, added
                assert STANDBY in await registered_nodes(redis, Keys(namespace), "itest")
                standby_pid = fleet.read_pid(tmp_path, STANDBY)
                assert standby_pid is not None
                assert fleet.is_alive(standby_pid)

                # The rebalance ran (its guard held: the new node was idle) and moved jobs
                # onto the new node, one child task per job: out with a checkpoint, in from it.
                moved = completed_outputs(watch, out.task_id, "migrate_jobs")
                assert int(str(moved["succeeded"])) >= 1, moved
                migrations = children_of(watch, out.task_id)
                assert migrations, trail(watch, out.task_id)
                for child in migrations:
                    assert child.kind == "migrate"
                    assert [s.action.action for s in child.steps] == ["migrate_job",
                                                                      "start_job"]
                    assert final_state(watch, child.task_id) == "succeeded", trail(
                        watch, child.task_id)
                    left = completed_outputs(watch, child.task_id, "migrate_job")
                    came = completed_outputs(watch, child.task_id, "start_job")
                    assert left["job_id"] == came["job_id"] == child.target
                    assert came["resumed_from_node"] in FLEET
                    assert getattr(child.steps[1].action, "node_id", "") == STANDBY
                moved_ids = {child.target for child in migrations}
                # Each moved job runs on the new node.
                await watch.wait_for(
                    lambda _: moved_ids <= {job for job, node
                                            in running_jobs(watch, [STANDBY]).items()
                                            if node == STANDBY},
                    60, f"{sorted(moved_ids)} running on {STANDBY}")

                # ---- below the range: drain, move out and release a node (the standby)
                everyone = [*FLEET, STANDBY]
                await until(lambda: len(running_jobs(watch, everyone)) == 2 * len(FLEET), 60,
                            "every job running")
                before = running_jobs(watch, everyone)
                assert set(before) == {f"{n}.{j}" for n in FLEET for j in ("train", "infer")}
                # 16 % of 4 GPUs: without the standby node's 2 GPUs the rest is at about
                # 32 %, inside the range, so exactly one node goes.
                set_load(tmp_path, everyone, 16.0)
                await watch.wait_for(lambda _: need_task(watch, "scale_in") is not None, 120,
                                     "a scale_in task")
                inn = need_task(watch, "scale_in")
                assert inn is not None
                await watch.wait_for(lambda _: bool(children_of(watch, inn.task_id)), 120,
                                     "the scale_in task to plan a node removal")
                # The plan is made and kept: back inside the range, so the pool does not
                # ask for a second removal once this one is done.
                set_load(tmp_path, everyone, 50.0)
                await watch.wait_for(lambda _: final_state(watch, inn.task_id) is not None,
                                     300, "the scale_in task to finish")
                assert final_state(watch, inn.task_id) == "succeeded", trail(watch, inn.task_id)

                removal = completed_outputs(watch, inn.task_id, "remove_capacity")
                assert (removal["nodes"], removal["direction"]) == (STANDBY, "in"), removal
                assert (removal["initial_nodes"], removal["target_nodes"]) == (3, 2), removal
                assert (removal["children"], removal["failed"]) == (1, 0), removal
                [remove] = children_of(watch, inn.task_id)
                assert (remove.kind, remove.target) == ("remove_node", STANDBY)
                assert [s.action.action for s in remove.steps] == [
                    "drain_node", "migrate_jobs", "release_node"]
                assert final_state(watch, remove.task_id) == "succeeded", trail(
                    watch, remove.task_id)
                released = completed_outputs(watch, remove.task_id, "release_node")
                assert released["released"] is True, released
                evacuation = children_of(watch, remove.task_id)
                assert {c.target for c in evacuation} == moved_ids, trail(watch,
                                                                          remove.task_id)
                for child in evacuation:
                    assert final_state(watch, child.task_id) == "succeeded", trail(
                        watch, child.task_id)
                    assert getattr(child.steps[1].action, "node_id", "") in FLEET

                # The node is gone: its agent stopped, out of the registry and the pool.
                assert not fleet.is_alive(standby_pid)
                assert fleet.read_pid(tmp_path, STANDBY) is None
                assert STANDBY not in await registered_nodes(redis, Keys(namespace), "itest")
                keys = Keys(namespace)
                assert await redis.zscore(keys.pool_nodes("itest", POOL), STANDBY) is None
                # Every job that ran before still runs, on the nodes that stay.
                await watch.wait_for(
                    lambda _: set(running_jobs(watch, FLEET)) == set(before), 60,
                    f"{sorted(before)} running on {FLEET}")
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()


async def test_a_backlog_of_ml_tasks_nothing_can_take_scales_the_pool_out(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    # Utilisation inside the range (50 %), and 8 ML tasks of a type no node serves: each
    # waits in the router until its deadline, a quarter of a GPU of queued demand each, so
    # 2 GPUs on the pool's 2: 50 % + 100 % demand is above the range. Demand alone scales out.
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_ENABLED_NEEDS='["scale"]', ANALYZER_SCALE__HOLD_S="3",
                    ANALYZER_POOL_PERIOD_S="1", ROUTER_TASK_GPUS="0.25")
    trusted = ensure_signer_keys(tmp_path / "keys")
    set_load(tmp_path, FLEET, 50.0)
    async with services(env, tmp_path, ("collector", "analyzer", "router")):
        await register(redis_url, namespace, "itest", FLEET)
        fleet.fleet_up(len(FLEET), 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_POOL_HEALTH, namespace)) as watch:
                await watch.wait_for(lambda r: is_pool_health(r, lambda h: h.nodes_by_state.get(
                    "up") == 2 and 40.0 < h.gpu_utilization_pct < 60.0), 90,
                    "the pool at 50 % with both nodes up")
                assert not [r for r in watch.records if r.topic.endswith(Topic.OPS_NEEDS.value)]
                for _ in range(8):
                    await producer.send_and_wait(name(Topic.ML_TASKS_SUBMITTED, namespace),
                                                 *unservable_task())
                record = await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.OPS_NEEDS.value), 90, "a scale_out need")
                need = OpsNeed.model_validate_json(record.value)
                assert (need.kind, need.target) == ("scale_out", POOL)
                assert need.evidence[0].value > 80.0
                assert "% gpu + 100.0% demand (8 ml_tasks)" in need.evidence[0].detail
                # The usage the analyzer saw stayed inside the range: demand did it.
                seen = [PoolHealth.model_validate_json(r.value) for r in watch.records
                        if r.topic.endswith(Topic.OPS_POOL_HEALTH.value)]
                assert all(h.gpu_utilization_pct < 80.0 for h in seen)
                assert max(h.demand_pct for h in seen) == 100.0
        finally:
            await producer.stop()
            fleet.fleet_down(tmp_path)


def is_pool_health(record: Record, check: Callable[[PoolHealth], bool]) -> bool:
    return (record.topic.endswith(Topic.OPS_POOL_HEALTH.value)
            and check(PoolHealth.model_validate_json(record.value)))


def unservable_task() -> tuple[bytes, bytes]:
    """(body, key) of an ML task of a type no node serves, with two minutes to wait."""
    task_id = uuid4()
    now = now_utc()
    event = MlTaskSubmitted(
        event_id=uuid4(), source="itest", occurred_at=now, cluster_id="itest",
        subject=str(task_id), task_id=task_id, task_type="nobody-serves-this", input=[1.0],
        deadline=now + timedelta(seconds=120), submitted_by="itest")
    return event.model_dump_json().encode(), str(task_id).encode()
