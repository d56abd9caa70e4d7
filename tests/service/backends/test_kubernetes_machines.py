"""Cluster API machines on the real API server (the MachineDeployment and Machine CRDs
installed, the test playing the infrastructure provider): a scale-up waits for its new
machine's Node and names it (so it is enrolled); a scale-down marks the machines it wants gone
with Cluster API's delete annotation before lowering the replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from schemas.kubernetes import CAPACITY_ANNOTATION, DELETE_MACHINE_ANNOTATION
from services.backends.base import Outcome, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.actuator import CapacitySource
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.capacity import CapacityRecord
from services.backends.kubernetes.connection import KubeAccess
from tests.kube import KubeScope, settled

POOL = "gpu"
ADD = StepRef(task_id="task-1", step="0:add-capacity")
REMOVE = StepRef(task_id="task-2", step="0:remove-capacity")


@pytest.fixture
async def machines(kube: KubeScope, kube_api: KubeAccess) -> AsyncIterator[KubernetesBackend]:
    """The backend with MachineDeployment capacity in the scope's namespace."""
    opened = await KubernetesBackend.open(
        kube_api, TokenBucket(20.0, 5),
        capacity=CapacitySource("machinedeployment", kube.namespace))
    try:
        yield opened
    finally:
        await opened.close()


async def replicas(kube: KubeScope) -> int:
    return int((await kube.machine_deployment(POOL))["spec"]["replicas"])


def annotations_of(obj: dict[str, object]) -> dict[str, str]:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return dict(meta.get("annotations") or {})


async def test_a_scale_up_waits_for_the_new_machines_node_and_names_it(
        kube: KubeScope, machines: KubernetesBackend) -> None:
    await kube.add_machine_deployment(POOL, replicas=1, gpus=8)
    old, _ = await kube.add_machine(POOL, "1")
    adding = asyncio.create_task(machines.add_capacity(POOL, 1, ADD, timeout_s=60.0))

    async def grown() -> bool:
        return await replicas(kube) == 2

    await settled(grown, "the MachineDeployment grown to 2")
    assert not adding.done()  # waiting for the machine's Node
    new, node = await kube.add_machine(POOL, "2")
    result = await adding

    assert result.outcome is Outcome.APPLIED, result
    assert (result.nodes, result.replicas, result.held) == ((node,), (1, 2), ()), result
    record = json.loads(annotations_of(await kube.machine(new))[CAPACITY_ANNOTATION])
    assert record == {"task_id": "task-1", "step": "0:add-capacity", "pool": POOL,
                      "state": "added"}
    assert CAPACITY_ANNOTATION not in annotations_of(await kube.machine(old))
    # A resend scales no further and names the same node.
    again = await machines.add_capacity(POOL, 1, ADD, timeout_s=5.0)
    assert (again.outcome, again.nodes, again.replicas) == (Outcome.ALREADY, (node,), (1, 2))
    assert await replicas(kube) == 2


async def test_a_machine_not_made_in_time_is_held_and_the_retry_finds_it(
        kube: KubeScope, machines: KubernetesBackend) -> None:
    await kube.add_machine_deployment(POOL, replicas=0, gpus=8)
    first = await machines.add_capacity(POOL, 1, ADD, timeout_s=1.0)
    assert first.nodes == (), first
    assert first.held, first
    assert first.replicas == (0, 1)

    _, node = await kube.add_machine(POOL, "1")
    retry = await machines.add_capacity(POOL, 1, ADD, timeout_s=30.0)
    assert (retry.nodes, retry.held) == ((node,), ()), retry
    assert await replicas(kube) == 1


async def test_a_scale_down_marks_an_idle_machine_clusterwarden_added_before_lowering(
        kube: KubeScope, kube_api: KubeAccess) -> None:
    await kube.add_machine_deployment(POOL, replicas=3, gpus=8)
    # The busy machine's Node alone first, so the GPU pod lands there.
    busy, busy_node = await kube.add_machine(POOL, "busy")
    await kube.add_gpu_statefulset("train", 1, gpus=8)

    async def placed() -> bool:
        return await kube.running_on(busy_node) == ["train-0"]

    await settled(placed, "the train pod Running on the busy machine's node")
    idle, _ = await kube.add_machine(POOL, "idle")
    ours_record = CapacityRecord(task_id="task-0", step="0:add-capacity", pool=POOL)
    ours, _ = await kube.add_machine(POOL, "ours",
                                     annotations={CAPACITY_ANNOTATION: ours_record.to_json()})
    backend = await KubernetesBackend.open(
        kube_api, TokenBucket(20.0, 5),
        capacity=CapacitySource("machinedeployment", kube.namespace))
    try:
        result = await backend.remove_capacity(POOL, (), REMOVE, count=1)
        assert (result.outcome, result.replicas) == (Outcome.APPLIED, (3, 2)), result
        assert annotations_of(await kube.machine(ours))[DELETE_MACHINE_ANNOTATION] == \
            "task-2/0:remove-capacity"
        for other in (busy, idle):
            assert DELETE_MACHINE_ANNOTATION not in annotations_of(await kube.machine(other))
        assert await replicas(kube) == 2
        # A resend marks nothing more and lowers nothing more.
        again = await backend.remove_capacity(POOL, (), REMOVE, count=1)
        assert (again.outcome, again.replicas) == (Outcome.ALREADY, (3, 2)), again
        assert DELETE_MACHINE_ANNOTATION not in annotations_of(await kube.machine(idle))
        assert await replicas(kube) == 2
        # A dry run of the next removal marks nothing (the idle machine would go).
        dry = await backend.remove_capacity(POOL, (), StepRef("task-3", "0:remove"),
                                            dry_run=True)
        assert dry.outcome is Outcome.DRY_RUN, dry
        assert DELETE_MACHINE_ANNOTATION not in annotations_of(await kube.machine(idle))
        assert await replicas(kube) == 2
    finally:
        await backend.close()
