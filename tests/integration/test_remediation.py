"""Action in depth on the real broker, Redis and agent processes: a GPU fault on a node that
runs a training job ends with the node offline, capacity added from the standby pool, and the
job running on another node from its checkpoint with its step counter continuing."""

from __future__ import annotations

import json
from pathlib import Path

from agent import fleet
from agent.jobs.processes import job_dir
from agent.ml.runtime import STATUS_FILE
from common.signing import ensure_signer_keys
from schemas.events.v1 import TaskEvent
from schemas.topics import Topic
from services.shared.registry import register
from tests.integration.harness import (
    Tap,
    is_up,
    name,
    services,
    stack_env,
    tap,
    until,
)

JOB = "node-002.train"


def task_events(events: Tap) -> list[TaskEvent]:
    return [TaskEvent.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]


def family(events: Tap, target: str) -> tuple[list[TaskEvent], list[TaskEvent]]:
    """The events of the task aimed at `target`, and those of its child tasks."""
    parsed = task_events(events)
    parents = {e.task_id for e in parsed if e.task is not None and e.task.target == target
               and e.task.parent_task_id is None}
    children = {e.task_id for e in parsed if e.task is not None
                and e.task.parent_task_id in parents}
    return ([e for e in parsed if e.task_id in parents],
            [e for e in parsed if e.task_id in children])


def finished(events: Tap, target: str) -> bool:
    parent, _ = family(events, target)
    return any(e.state in ("succeeded", "failed", "terminated") for e in parent)


def step_outputs(events: list[TaskEvent], action_name: str) -> dict[str, object]:
    """The outputs of the completed step whose task plan names `action_name`."""
    plans = {e.task_id: e.task for e in events if e.task is not None}
    for event in events:
        plan = plans.get(event.task_id)
        if (plan is not None and event.step_state == "completed" and event.step_index is not None
                and plan.steps[event.step_index].action.action == action_name):
            return dict(event.outputs)
    raise AssertionError(f"no completed {action_name} step in {[e.reason for e in events]}")


def job_step(state_dir: Path, node: str, job: str) -> int:
    """The training step a job's latest status on `node` reports (-1 if none yet)."""
    path = job_dir(fleet.agent_dir(state_dir, node), job) / STATUS_FILE
    try:
        return int(json.loads(path.read_bytes()).get("step", -1))
    except (FileNotFoundError, ValueError):
        return -1


async def test_a_gpu_fault_moves_the_training_job_to_another_node_with_its_progress_kept(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="train", AGENT_CHECKPOINT_EVERY_S="2",
        # Only the fault need: the loads held below must not raise scale or balance needs.
        ANALYZER_ENABLED_NEEDS='["offline"]',
        # An operator's low pool range (not the default 20/25 %), off this test's path: the
        # analyzer's ranges must travel on the need to the task and the executor's children.
        ANALYZER_SCALE__LOW_ENTER="15", ANALYZER_SCALE__LOW_EXIT="18",
        CAPACITY_PROVIDER="local", CAPACITY_LOCAL_STANDBY="standby-1:2",
        SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.5",
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    nodes = ["node-001", "node-002", "node-003"]
    # The pool is busy: once node-002 is out, the rest is above its range (80 %).
    for node in nodes:
        fleet.inject_fault(tmp_path, node, load_pct=90.0)
    async with services(env, tmp_path):
        await register(redis_url, namespace, "itest", nodes)
        fleet.fleet_up(3, 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace)) as watch:
                for node in nodes:
                    await watch.wait_for(is_up(node), 60, f"{node} up")
                await until(lambda: job_step(tmp_path, "node-002", JOB) > 0, 60,
                            "the training job on node-002 to make progress")

                fleet.inject_fault(tmp_path, "node-002", xid=[79], load_pct=90.0)
                await watch.wait_for(lambda _: finished(watch, "node-002"), 180,
                                     "the offline task of node-002 to finish")
                parent, children = family(watch, "node-002")
                assert parent[-1].state == "succeeded", [e.reason for e in parent + children]

                # The plan of the method: offline, capacity, migrate, capacity.
                plan = parent[0].task
                assert plan is not None
                assert [s.action.action for s in plan.steps] == [
                    "drain_node", "offline_node", "add_capacity", "migrate_jobs",
                    "add_capacity"]
                assert plan.ranges is not None
                assert (plan.ranges.pool.low_enter, plan.ranges.pool.low_exit) == (15.0, 18.0)

                # The pool was above its range without node-002: the standby node was added,
                # and the step recorded what it started from and what it aimed at.
                added = step_outputs(parent, "add_capacity")
                assert added["nodes"] == "standby-1", added
                assert added["added"] == 1, added
                for key in ("initial_nodes", "initial_util_pct", "target_nodes",
                            "target_util_pct"):
                    assert key in added, added
                assert int(str(added["target_nodes"])) > int(str(added["initial_nodes"]))
                await watch.wait_for(is_up("standby-1"), 60, "standby-1 up")

                # One child task moved the job: out of node-002 with a checkpoint, into a
                # healthy node from it.
                assert children, "\n".join(
                    f"{e.step_index} {e.step_state} {e.reason} {e.outputs}" for e in parent)
                assert children[-1].state == "succeeded", [e.reason for e in children]
                out = step_outputs(children, "migrate_job")
                into = step_outputs(children, "start_job")
                assert out["job_id"] == JOB
                assert into["job_id"] == JOB
                saved = int(str(out["step"]))
                assert saved > 0
                assert into["resumed_step"] == saved
                child_plan = next(e.task for e in children if e.task is not None)
                destination = getattr(child_plan.steps[1].action, "node_id", "")
                assert child_plan.ranges == plan.ranges
                assert destination != "node-002"

                # It runs there, and its step counter continues from the checkpoint.
                await until(lambda: job_step(tmp_path, destination, JOB) > saved, 60,
                            f"{JOB} to train on past step {saved} on {destination}")
                assert job_step(tmp_path, "node-002", JOB) <= saved
        finally:
            fleet.fleet_down(tmp_path)
