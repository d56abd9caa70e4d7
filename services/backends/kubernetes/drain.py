"""Draining a node's GPU pods through the Eviction API, paced by the cluster's budget.

Each eviction takes a token from the cluster's `TokenBucket` first. The API server answers 201
(the pod goes), 429 (a PodDisruptionBudget says not now: wait and try again within the step's
time, not a failure), 409 (another eviction updated the PDB meanwhile: try again) or 404
(already gone: a resend after a crash). After the evictions, each pod's controller must have a
replacement Running on another node; the cache's watch says when. A pod with no controller
has nothing to wait for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from common.clock import EpochClock
from schemas.kubernetes import STEP_ANNOTATION
from services.backends.base import BackendError, DrainResult, PodMove, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.cache import ClusterCache
from services.backends.kubernetes.connection import as_json, call, dry_run_args
from services.backends.kubernetes.gpus import PodRef, find_replacement, live, pod_gpus

PDB_RETRY_S = 1.0


@dataclass
class DrainRun:
    """One drain's state: what was found on the node and what became of it."""

    node: str
    step: StepRef
    deadline: float
    dry_run: bool
    waiting: dict[str, PodRef] = field(default_factory=dict)
    pdb_waits: dict[str, int] = field(default_factory=dict)
    evicted: list[PodRef] = field(default_factory=list)
    seen_uids: set[str] = field(default_factory=set)


class Drainer:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, budget: TokenBucket, *,
                 clock: EpochClock = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._cache = cache
        self._budget = budget
        self._clock = clock
        self._sleep = sleep or asyncio.sleep

    async def gpu_pods_on(self, node: str) -> list[PodRef]:
        """The node's live GPU pods, read from the API server (not the cache) before acting."""
        answer = await call(f"list pods on {node}", lambda: self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}"))
        pods = [as_json(self._api, p) for p in answer.items]
        return [PodRef.of(p) for p in pods if live(p) and pod_gpus(p) > 0]

    async def drain(self, node: str, step: StepRef, *, timeout_s: float,
                    dry_run: bool) -> DrainResult:
        run = DrainRun(node=node, step=step, deadline=self._clock() + timeout_s,
                       dry_run=dry_run)
        pods = await self.gpu_pods_on(node)
        run.waiting = {p.key: p for p in pods}
        run.seen_uids = {p.uid for p in pods}
        while run.waiting:
            for key, pod in list(run.waiting.items()):
                if await self._evict(pod, run):
                    del run.waiting[key]
                    run.evicted.append(pod)
            if not run.waiting or dry_run or self._clock() >= run.deadline:
                break
            await self._sleep(min(PDB_RETRY_S, max(run.deadline - self._clock(), 0.0)))
        moves = [PodMove(p.namespace, p.name, node, pdb_waits=run.pdb_waits.get(p.key, 0))
                 for p in run.evicted]
        if not dry_run:
            moves = await self._placed(run, moves)
        unplaced = [f"{m.namespace}/{m.pod}" for m, p in zip(moves, run.evicted, strict=True)
                    if p.controller_uid is not None and m.replacement is None]
        return DrainResult(node=node, moved=tuple(moves), held=tuple(sorted(run.waiting)),
                           unplaced=tuple(unplaced), dry_run=dry_run)

    async def _evict(self, pod: PodRef, run: DrainRun) -> bool:
        """True once the pod is evicted (or gone); False while a PDB holds it."""
        await self._budget.acquire()
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(
                name=pod.name, namespace=pod.namespace,
                annotations={STEP_ANNOTATION: f"{run.step.task_id}/{run.step.step}"}),
            delete_options=client.V1DeleteOptions(dry_run=["All"]) if run.dry_run else None)
        try:
            await call(f"evict pod {pod.key}", lambda: self._core.create_namespaced_pod_eviction(
                pod.name, pod.namespace, body, **dry_run_args(run.dry_run)))
        except ApiException as err:
            if err.status == 429:
                run.pdb_waits[pod.key] = run.pdb_waits.get(pod.key, 0) + 1
                return False
            if err.status == 409:
                # Two evictions raced on the same PDB's status: the next round tries again.
                return False
            if err.status == 404:
                return True
            raise BackendError(f"evict pod {pod.key}: {err.status} {err.reason}") from err
        return True

    async def _placed(self, run: DrainRun, moves: list[PodMove]) -> list[PodMove]:
        """Each move with its replacement, once the controller's new pod runs elsewhere."""
        claimed: set[str] = set(run.seen_uids)
        placed = []
        for pod, move in zip(run.evicted, moves, strict=True):
            if pod.controller_uid is None:
                placed.append(move)
                continue
            def found(evicted: PodRef = pod) -> PodRef | None:
                match = find_replacement(evicted, self._cache.pods_of(evicted.controller_uid),
                                         claimed)
                return PodRef.of(match) if match is not None else None
            replacement = await self._cache.wait_for(found, run.deadline - self._clock())
            if replacement is None:
                placed.append(move)
                continue
            claimed.add(replacement.uid)
            placed.append(replace(move, replacement=replacement.name,
                                  to_node=replacement.node))
        return placed
