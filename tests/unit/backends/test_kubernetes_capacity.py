"""Capacity on Kubernetes, the pure decisions: which standby nodes a step takes or gives back,
what each write patches, the one-owner rule, and how far a MachineDeployment is scaled."""

from __future__ import annotations

import json
from typing import Any

from schemas.kubernetes import (
    CAPACITY_ANNOTATION,
    GPU_COUNT_ANNOTATION,
    OFFLINE_ANNOTATION,
    POOL_LABEL,
    STANDBY_LABEL,
    TAINT_KEY,
)
from services.backends.base import Outcome, StepRef
from services.backends.kubernetes.capacity import (
    CapacityRecord,
    MachineDeploymentView,
    StandbyChoice,
    StandbyNode,
    choose_returns,
    choose_standby,
    decide_release,
    decide_return,
    decide_scale,
    decide_take,
    gpus_to_cover,
    machines_for,
    record_of,
    why_not_free,
)
from services.backends.kubernetes.protocol import NodeView

STEP = StepRef(task_id="task-1", step="0:add")
OTHER = StepRef(task_id="task-0", step="0:add")


def node(name: str, *, gpus: int = 8, standby: bool = True, cordoned: bool = True,
         ready: bool = True, pool: str | None = None, record: CapacityRecord | None = None,
         gpu_pods: int = 0, taints: tuple[dict[str, Any], ...] = (),
         offline_claim: bool = False) -> StandbyNode:
    labels = {STANDBY_LABEL: "true"} if standby else {}
    if pool is not None:
        labels[POOL_LABEL] = pool
    annotations = {}
    if record is not None:
        annotations[CAPACITY_ANNOTATION] = record.to_json()
    if offline_claim:
        annotations[OFFLINE_ANNOTATION] = json.dumps(
            {"task_id": "t", "step": "0:offline", "reason": "xid", "effect": "NoSchedule"})
    view = NodeView(name=name, resource_version="7", unschedulable=cordoned, taints=taints,
                    annotations=annotations, labels=labels)
    return StandbyNode(view, gpus=gpus, ready=ready, gpu_pods=gpu_pods)


def added(step: StepRef = OTHER, pool: str = "default",
          state: str = "added", asked: int = 0) -> CapacityRecord:
    return CapacityRecord(task_id=step.task_id, step=step.step, pool=pool,
                          state=state, asked=asked)  # type: ignore[arg-type]


def test_only_a_cordoned_ready_standby_node_nobody_took_is_free() -> None:
    assert why_not_free(node("a")) is None
    assert "not labelled" in (why_not_free(node("a", standby=False)) or "")
    assert "someone else uses it" in (why_not_free(node("a", cordoned=False)) or "")
    assert "not Ready" in (why_not_free(node("a", ready=False)) or "")
    assert "already added by task task-0" in (why_not_free(node("a", record=added())) or "")
    # A node ClusterWarden took offline is being repaired, whoever's taint it carries.
    assert "offline" in (why_not_free(node("a", offline_claim=True)) or "")
    taint = ({"key": TAINT_KEY, "value": "x", "effect": "NoSchedule"},)
    assert "offline" in (why_not_free(node("a", taints=taint)) or "")


def choice(nodes: list[StandbyNode], pool: str, step: StepRef, count: int,
           shortfall_gpus: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the step's nodes, the nodes to take now)."""
    return choose_standby(nodes, pool, step, count, shortfall_gpus)[:2]


def test_the_largest_free_nodes_of_the_pool_cover_the_shortfall() -> None:
    nodes = [node("small", gpus=4), node("b", gpus=8), node("a", gpus=8),
             node("other-pool", gpus=16, pool="inference"), node("busy", cordoned=False)]
    assert choose_standby(nodes, "default", STEP, 0, shortfall_gpus=10) == StandbyChoice(
        (), ("a", "b"), asked=2)
    assert choice(nodes, "default", STEP, 0, shortfall_gpus=0) == ((), ("a",))
    assert choice(nodes, "default", STEP, 3, shortfall_gpus=0) == ((), ("a", "b", "small"))
    # More than there are: all of them, and the step still asks for what it asked.
    assert choose_standby(nodes, "default", STEP, 9, shortfall_gpus=0)[1:] == (
        ("a", "b", "small"), 9)
    # A pool's own standby node serves it; one without the label serves any pool.
    assert choice(nodes, "inference", STEP, 1, shortfall_gpus=0) == ((), ("other-pool",))


def test_a_resend_counts_what_the_step_already_took() -> None:
    nodes = [node("a", cordoned=False, record=added(STEP)), node("b"), node("c"),
             node("d", cordoned=False, record=added(OTHER))]
    assert choice(nodes, "default", STEP, 1, shortfall_gpus=0) == (("a",), ())
    assert choice(nodes, "default", STEP, 2, shortfall_gpus=0) == (("a",), ("b",))


def test_a_resend_of_no_count_takes_what_its_first_attempt_asked_and_did_not_take() -> None:
    # The first attempt asked 2 for a 16-GPU shortfall and took "a": the resend takes one
    # more, whatever the shortfall reads now (pods may not have landed on "a" yet, or have).
    nodes = [node("a", cordoned=False, record=added(STEP, asked=2)), node("b"), node("c")]
    assert choice(nodes, "default", STEP, 0, shortfall_gpus=8) == (("a",), ("b",))
    assert choice(nodes, "default", STEP, 0, shortfall_gpus=0) == (("a",), ("b",))
    assert choice(nodes, "default", STEP, 0, shortfall_gpus=24) == (("a",), ("b",))
    # Its first attempt took all it asked: nothing more.
    done = [node("a", cordoned=False, record=added(STEP, asked=1)), node("b")]
    assert choice(done, "default", STEP, 0, shortfall_gpus=8) == (("a",), ())
    # A record from before `asked` was kept: the nodes taken are what was asked.
    legacy = [node("a", cordoned=False, record=added(STEP)), node("b")]
    assert choice(legacy, "default", STEP, 0, shortfall_gpus=8) == (("a",), ())


def test_the_record_keeps_how_many_the_step_asked() -> None:
    taken = decide_take(node("a").view, STEP, "default", True, asked=3)
    assert taken.patch is not None
    raw = taken.patch["metadata"]["annotations"][CAPACITY_ANNOTATION]
    assert record_of({CAPACITY_ANNOTATION: raw}) == CapacityRecord(
        task_id=STEP.task_id, step=STEP.step, pool="default", asked=3)


def test_gpus_to_cover_takes_at_least_one_node() -> None:
    assert gpus_to_cover(0, [8, 8]) == 1
    assert gpus_to_cover(9, [8, 8, 8]) == 2
    assert gpus_to_cover(100, [8, 8]) == 2
    assert gpus_to_cover(3, []) == 1


def test_taking_uncordons_and_records_the_step_and_a_resend_writes_nothing() -> None:
    free = node("a").view
    decision = decide_take(free, STEP, "default", ready=True)
    assert decision.outcome is Outcome.APPLIED
    assert decision.patch is not None
    assert decision.patch["spec"] == {"unschedulable": None}
    assert decision.patch["metadata"]["resourceVersion"] == "7"
    record = record_of(decision.patch["metadata"]["annotations"])
    assert record == CapacityRecord("task-1", "0:add", "default", "added")
    taken = node("a", cordoned=False, record=record).view
    assert decide_take(taken, STEP, "default", ready=True).outcome is Outcome.ALREADY
    # Another step finds it taken; a person's use of a standby node is refused too.
    assert decide_take(taken, OTHER, "default", ready=True).outcome is Outcome.REFUSED
    in_use = node("b", cordoned=False).view
    refused = decide_take(in_use, STEP, "default", ready=True)
    assert refused.outcome is Outcome.REFUSED
    assert refused.patch is None


def test_only_nodes_clusterwarden_added_are_given_back_idle_and_smallest_first() -> None:
    nodes = [node("busy", cordoned=False, record=added(), gpu_pods=2),
             node("idle", cordoned=False, record=added()),
             node("small-idle", gpus=4, cordoned=False, record=added()),
             node("persons", cordoned=False),
             node("standby"),
             node("elsewhere", cordoned=False, record=added(pool="inference"))]
    assert choose_returns(nodes, "default", STEP, (), 0) == ("small-idle", "idle")
    assert choose_returns(nodes, "default", STEP, (), 3) == ("small-idle", "idle", "busy")
    assert choose_returns(nodes, "default", STEP, ("busy", "persons"), 0) == ("busy",)
    returning = [*nodes, node("going", record=added(STEP, state="returning"))]
    assert choose_returns(returning, "default", STEP, (), 2) == ("going", "small-idle")


def test_giving_back_cordons_marks_then_releases_and_refuses_a_persons_node() -> None:
    mine = node("a", cordoned=False, record=added()).view
    cordon = decide_return(mine, STEP)
    assert cordon.outcome is Outcome.APPLIED
    assert cordon.patch is not None
    assert cordon.patch["spec"] == {"unschedulable": True}
    going = record_of(cordon.patch["metadata"]["annotations"])
    assert going is not None
    assert going.state == "returning"
    assert going.by(STEP)
    returning = node("a", record=going).view
    assert decide_return(returning, STEP).outcome is Outcome.ALREADY
    release = decide_release(returning)
    assert release.outcome is Outcome.APPLIED
    assert release.patch is not None
    assert release.patch["metadata"]["annotations"] == {CAPACITY_ANNOTATION: None}
    assert release.patch["spec"] == {"unschedulable": True}
    assert decide_release(node("a").view).outcome is Outcome.ALREADY
    # Taken again by an add meanwhile: not released from under it.
    assert decide_release(mine).outcome is Outcome.REFUSED
    assert decide_return(node("p", cordoned=False).view, STEP).outcome is Outcome.REFUSED


def machine_deployment(replicas: int, annotations: dict[str, str] | None = None,
                       ) -> MachineDeploymentView:
    return MachineDeploymentView.of({
        "metadata": {"name": "default", "namespace": "capi", "resourceVersion": "3",
                     "annotations": annotations or {}},
        "spec": {"replicas": replicas}})


def test_machines_for_the_pending_gpus_at_least_one() -> None:
    assert machines_for(2, shortfall_gpus=100, gpus_per_machine=8) == 2
    assert machines_for(0, shortfall_gpus=17, gpus_per_machine=8) == 3
    assert machines_for(0, shortfall_gpus=0, gpus_per_machine=8) == 1
    assert machines_for(0, shortfall_gpus=17, gpus_per_machine=0) == 1
    assert machine_deployment(1, {GPU_COUNT_ANNOTATION: "4"}).gpus_per_machine == 4
    assert machine_deployment(1, {GPU_COUNT_ANNOTATION: "many"}).gpus_per_machine == 0


def test_scaling_records_the_step_and_a_resend_writes_nothing() -> None:
    decision = decide_scale(machine_deployment(1), STEP, 2)
    assert (decision.outcome, decision.before, decision.after) == (Outcome.APPLIED, 1, 3)
    assert decision.patch is not None
    assert decision.patch["spec"] == {"replicas": 3}
    assert decision.patch["metadata"]["resourceVersion"] == "3"
    scaled = machine_deployment(3, decision.patch["metadata"]["annotations"])
    again = decide_scale(scaled, STEP, 2)
    assert (again.outcome, again.before, again.after, again.patch) == (
        Outcome.ALREADY, 1, 3, None)
    # Another step scales from where it is; never below zero.
    down = decide_scale(scaled, OTHER, -5)
    assert (down.outcome, down.before, down.after) == (Outcome.APPLIED, 3, 0)
    assert decide_scale(machine_deployment(0), OTHER, -1).outcome is Outcome.ALREADY
