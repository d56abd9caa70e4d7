"""The standby pool on the real API server: an `add_capacity` of no set count is sized by the
pool's own shortfall (its pending GPU pods, pods naming no pool counted in the cluster's
default pool), never by the pods waiting for another pool."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from schemas.kubernetes import POOL_LABEL, STANDBY_LABEL
from services.backends.base import Outcome, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.connection import KubeAccess
from tests.kube import KubeScope, settled

POOL = "train"
ADD = StepRef(task_id="task-1", step="0:add-capacity")


@pytest.fixture
async def standby(kube_api: KubeAccess) -> AsyncIterator[KubernetesBackend]:
    """The backend of a cluster whose agents report in pool `train`."""
    opened = await KubernetesBackend.open(kube_api, TokenBucket(20.0, 5), default_pool=POOL)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_standby_add_of_no_count_covers_its_pools_pending_gpus_alone(
        kube: KubeScope, standby: KubernetesBackend) -> None:
    spares = [await kube.add_gpu_node(f"spare-{i}", cordoned=True,
                                      labels={STANDBY_LABEL: "true", POOL_LABEL: POOL})
              for i in range(3)]
    # 16 GPUs wait for the inference pool (no node of it here), 8 for the default pool: the
    # train pool is short of one 8-GPU node, not of three.
    await kube.add_gpu_statefulset("serve", 2, gpus=8, pool="inference")
    await kube.add_gpu_statefulset("train", 1, gpus=8)

    async def all_pending() -> int | None:
        queued = {d.pool: d.gpus for d in await standby.queued_demand(POOL)}
        return queued.get(POOL) if queued.get("inference") == 16 else None
    assert await settled(all_pending, "24 GPUs of pending pods in the cache") == 8

    added = await standby.add_capacity(POOL, 0, ADD)
    assert added.outcome is Outcome.APPLIED, added.detail
    assert len(added.nodes) == 1
    assert added.nodes[0] in spares
    assert (await kube.node(added.nodes[0]))["spec"].get("unschedulable") is not True
    # A resend of the step finds its node and takes no other.
    again = await standby.add_capacity(POOL, 0, ADD)
    assert again.nodes == added.nodes
    assert again.outcome is Outcome.ALREADY
    untouched = [n for n in spares if n not in added.nodes]
    assert [(await kube.node(n))["spec"].get("unschedulable") for n in untouched] == [True, True]
