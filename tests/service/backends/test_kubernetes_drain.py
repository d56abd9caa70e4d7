"""Draining a node's GPU pods on a real API server: evictions through the Eviction API, paced
by the cluster's budget; a PodDisruptionBudget holds a pod (429) until it allows it; the
controller's replacement is found Running on a healthy node (the real scheduler and
controller-manager, kwok playing the kubelets); dry run evicts nothing."""

from __future__ import annotations

import asyncio
import json

from schemas.kubernetes import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_REQUEST_ANNOTATION,
    CHECKPOINT_TIMEOUT_ANNOTATION,
    OFFLINE_ANNOTATION,
)
from services.backends.base import Checkpoint, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.backend import KubernetesBackend
from services.backends.kubernetes.connection import KubeAccess, as_json
from tests.kube import KubeScope, settled

OFFLINE = StepRef(task_id="task-1", step="0:offline_node")
DRAIN = StepRef(task_id="task-1", step="1:drain_node")
TIMEOUT_S = 60.0


async def two_pods_on_a_bad_node(kube: KubeScope, backend: KubernetesBackend, *,
                                 min_available: int, offline: bool = True) -> str:
    """StatefulSet `train` (2 pods, 2 GPUs each) on one node, a PDB over it, two healthy
    nodes beside it, and the bad node offline unless told otherwise."""
    bad = await kube.add_gpu_node("bad")
    await kube.add_gpu_statefulset("train", 2, gpus=2)
    await settled(lambda: _both_running(kube, bad), "both train pods Running on the bad node")
    await kube.add_pdb("train", "train", min_available)
    await kube.add_gpu_node("good-1")
    await kube.add_gpu_node("good-2")
    if offline:
        await backend.offline_node(bad, OFFLINE, "xid 79")
    return bad


async def _both_running(kube: KubeScope, node: str) -> bool:
    return await kube.running_on(node) == ["train-0", "train-1"]


async def test_drain_evicts_waits_on_the_pdb_and_finds_replacements_on_healthy_nodes(
        kube: KubeScope, backend: KubernetesBackend, budget: TokenBucket) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=1)

    result = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)

    assert result.complete, result
    assert sorted(m.pod for m in result.moved) == ["train-0", "train-1"]
    for move in result.moved:
        assert move.from_node == bad
        assert move.replacement == move.pod  # a StatefulSet's replacement keeps its name
        assert move.to_node is not None
        assert move.to_node.startswith(f"{kube.prefix}-good-")
    # The PDB lets one go at a time; the waits it caused are recorded (how many depends on
    # how fast the first replacement ran: a held pod alone is the next test).
    # Every eviction request, refused or not, took a token from the cluster's budget.
    assert budget.taken == 2 + sum(m.pdb_waits for m in result.moved)
    assert await kube.running_on(bad) == []
    for move in result.moved:
        assert move.pod in await kube.running_on(move.to_node or "")


class GateBudget(TokenBucket):
    """A budget that hands out no token until `together` evictions ask for one at once: a
    drain that evicts its pods one after another (each after the previous one's answer) never
    gets there."""

    def __init__(self, together: int) -> None:
        super().__init__(rate_per_s=100.0, burst=together)
        self.together = together
        self.asking = 0
        self._all_asked = asyncio.Event()

    async def acquire(self) -> None:
        self.asking += 1
        if self.asking >= self.together:
            self._all_asked.set()
        await asyncio.wait_for(self._all_asked.wait(), 10.0)
        await super().acquire()


async def test_a_drain_asks_for_every_pods_token_at_once_so_the_budget_alone_paces_it(
        kube: KubeScope, kube_api: KubeAccess) -> None:
    gate = GateBudget(together=2)
    opened = await KubernetesBackend.open(kube_api, gate)
    try:
        bad = await two_pods_on_a_bad_node(kube, opened, min_available=0)

        result = await opened.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)
    finally:
        await opened.close()

    assert result.complete, result
    assert sorted(m.pod for m in result.moved) == ["train-0", "train-1"]
    assert gate.taken == 2


async def test_a_pdb_that_never_allows_holds_the_pod_until_it_is_lowered(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=2)

    held = await backend.drain_node(bad, DRAIN, timeout_s=3.0)

    assert held.moved == ()
    assert held.held == (f"{kube.namespace}/train-0", f"{kube.namespace}/train-1")
    assert not held.complete
    assert await kube.running_on(bad) == ["train-0", "train-1"]

    await kube.set_pdb_min_available("train", 1)
    done = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)
    assert done.complete, done
    assert sorted(m.pod for m in done.moved) == ["train-0", "train-1"]
    assert await kube.running_on(bad) == []


async def test_a_resent_drain_of_a_drained_node_evicts_nothing(
        kube: KubeScope, backend: KubernetesBackend, budget: TokenBucket) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=0)
    first = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)
    assert first.complete, first
    taken = budget.taken

    again = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)

    assert again.moved == ()
    assert again.complete
    assert budget.taken == taken


async def test_dry_run_drain_cordons_and_evicts_nothing_and_says_what_the_pdb_would_hold(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=2, offline=False)
    pods_before = {p["metadata"]["uid"] for p in await kube.pods()}

    result = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S, dry_run=True)

    assert result.dry_run
    node = await kube.node(bad)
    assert not node["spec"].get("unschedulable")
    assert OFFLINE_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert result.held == (f"{kube.namespace}/train-0", f"{kube.namespace}/train-1")
    assert {p["metadata"]["uid"] for p in await kube.pods()} == pods_before
    assert await kube.running_on(bad) == ["train-0", "train-1"]

    await kube.set_pdb_min_available("train", 0)
    allowed = await settled(
        lambda: _dry_run_moves(backend, bad), "a dry-run drain the lowered PDB allows")
    assert allowed == ["train-0", "train-1"]
    assert {p["metadata"]["uid"] for p in await kube.pods()} == pods_before


async def _dry_run_moves(backend: KubernetesBackend, node: str) -> list[str] | None:
    result = await backend.drain_node(node, DRAIN, timeout_s=TIMEOUT_S, dry_run=True)
    return sorted(m.pod for m in result.moved) if not result.held else None


async def test_a_drain_cordons_and_claims_the_node_before_it_evicts(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=0, offline=False)

    result = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S, reason="xid 79")

    assert result.complete, result
    assert all(m.to_node != bad for m in result.moved)
    node = await kube.node(bad)
    assert node["spec"]["unschedulable"] is True
    assert OFFLINE_ANNOTATION in node["metadata"]["annotations"]


async def test_a_node_a_person_cordoned_is_never_drained(
        kube: KubeScope, backend: KubernetesBackend, budget: TokenBucket) -> None:
    bad = await two_pods_on_a_bad_node(kube, backend, min_available=0, offline=False)
    await kube.core.patch_node(bad, {"spec": {"unschedulable": True}})

    result = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)

    assert "cordoned by someone else" in result.refused
    assert not result.complete
    assert result.moved == ()
    assert budget.taken == 0
    assert await kube.running_on(bad) == ["train-0", "train-1"]
    assert OFFLINE_ANNOTATION not in ((await kube.node(bad))["metadata"].get("annotations")
                                      or {})


async def test_a_drain_asks_an_opted_in_pod_once_and_records_the_step_it_saved(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    bad = await kube.add_gpu_node("bad")
    await kube.add_gpu_statefulset("ckpt", 1, gpus=2,
                                   annotations={CHECKPOINT_TIMEOUT_ANNOTATION: "30"})
    await settled(lambda: _running(kube, bad, ["ckpt-0"]), "ckpt-0 Running on the bad node")
    await kube.add_pdb("ckpt", "ckpt", 1)
    await kube.add_gpu_node("good-1")

    # No answer within the drain's share, and the PDB holds the pod: asked, not evicted.
    held = await backend.drain_node(bad, DRAIN, timeout_s=4.0)
    assert held.held == (f"{kube.namespace}/ckpt-0",)
    request = await _request_on(kube, "ckpt-0")
    assert json.loads(request)["id"] == "task-1/1:drain_node"

    # The same step again (a retry): its own request is found, not written anew.
    again = await backend.drain_node(bad, DRAIN, timeout_s=4.0)
    assert again.held == held.held
    assert await _request_on(kube, "ckpt-0") == request

    # The workload answers; the PDB lets it go: evicted, with the step it saved.
    await kube.core.patch_namespaced_pod("ckpt-0", kube.namespace, {"metadata": {
        "annotations": {CHECKPOINT_ANNOTATION: json.dumps(
            {"request": json.loads(request)["id"], "step": 77})}}})
    await kube.set_pdb_min_available("ckpt", 0)
    done = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)
    assert done.complete, done
    (move,) = done.moved
    assert (move.pod, move.checkpoint, move.checkpoint_step) == ("ckpt-0", Checkpoint.ACKED, 77)
    assert move.to_node == f"{kube.prefix}-good-1"


async def test_a_pod_that_never_answers_is_evicted_after_its_timeout(
        kube: KubeScope, backend: KubernetesBackend) -> None:
    bad = await kube.add_gpu_node("bad")
    await kube.add_gpu_statefulset("ckpt", 1, gpus=2,
                                   annotations={CHECKPOINT_TIMEOUT_ANNOTATION: "1"})
    await kube.add_gpu_statefulset("plain", 1, gpus=2)
    await settled(lambda: _running(kube, bad, ["ckpt-0", "plain-0"]), "both Running on bad")
    await kube.add_gpu_node("good-1")

    done = await backend.drain_node(bad, DRAIN, timeout_s=TIMEOUT_S)

    assert done.complete, done
    outcomes = {m.pod: (m.checkpoint, m.checkpoint_step) for m in done.moved}
    assert outcomes == {"ckpt-0": (Checkpoint.TIMED_OUT, None),
                        "plain-0": (Checkpoint.NOT_ASKED, None)}
    assert await kube.running_on(bad) == []


async def _running(kube: KubeScope, node: str, pods: list[str]) -> bool:
    return await kube.running_on(node) == pods


async def _request_on(kube: KubeScope, pod: str) -> str:
    read = as_json(kube.api, await kube.core.read_namespaced_pod(pod, kube.namespace))
    request: str = read["metadata"]["annotations"][CHECKPOINT_REQUEST_ANNOTATION]
    return request
