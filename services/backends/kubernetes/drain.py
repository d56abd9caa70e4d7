"""Draining a node's GPU pods through the Eviction API, paced by the cluster's budget.

Each eviction takes a token from the cluster's `TokenBucket` first; a node's pods are
evicted side by side, so the bucket, not the API server's answers, sets the pace. The API
server answers 201 (the pod goes), 429 (a PodDisruptionBudget says not now: wait and try again
within the step's time, not a failure), 409 (another eviction updated the PDB meanwhile: try
again) or 404 (already gone: a resend after a crash). After the evictions, each pod's
controller must have a replacement Running on another node; the cache's watch says when. A pod
with no controller has nothing to wait for.

Before any eviction, each pod that opts in to the checkpoint protocol (checkpoint.py) is asked
to checkpoint, and the drain waits on the watch for its answer, up to the pod's timeout and at
most half the drain's time (the evictions and the replacements need the rest).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from common.clock import EpochClock
from schemas.kube_gpus import pod_gpus
from schemas.kubernetes import STEP_ANNOTATION
from services.backends.base import BackendError, Checkpoint, DrainResult, PodMove, StepRef
from services.backends.budget import TokenBucket
from services.backends.kubernetes.cache import ClusterCache
from services.backends.kubernetes.checkpoint import (
    CheckpointAck,
    CheckpointPlan,
    ack_of,
    annotations_of,
    plan_checkpoint,
    request_patch,
    resumed_from,
)
from services.backends.kubernetes.connection import as_json, call, dry_run_args, merge_patch_pod
from services.backends.kubernetes.gpus import PodRef, find_replacement, live

PDB_RETRY_S = 1.0
# The checkpoints' wait may take this share of the drain's time at most.
CHECKPOINT_SHARE = 0.5
# After a workload that acknowledged a checkpoint gets its replacement, how long the drain
# waits for the replacement to say which step it resumed from (it may never say).
RESUME_REPORT_S = 5.0
CONFLICT_TRIES = 5


@dataclass(frozen=True)
class Checkpointed:
    """A pod's checkpoint before its eviction: asked or not, and the answer."""

    outcome: Checkpoint
    ack: CheckpointAck | None = None


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
    checkpoints: dict[str, Checkpointed] = field(default_factory=dict)


class Drainer:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, budget: TokenBucket, *,
                 clock: EpochClock = time.monotonic, wall: EpochClock = time.time,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)
        self._cache = cache
        self._budget = budget
        self._clock = clock
        self._wall = wall
        """The time a checkpoint request records (it outlives this process)."""
        self._sleep = sleep or asyncio.sleep

    async def _gpu_pods_json(self, node: str) -> list[dict[str, Any]]:
        answer = await call(f"list pods on {node}", lambda: self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}"))
        pods = [as_json(self._api, p) for p in answer.items]
        return [p for p in pods if live(p) and pod_gpus(p) > 0]

    async def gpu_pods_on(self, node: str) -> list[PodRef]:
        """The node's live GPU pods, read from the API server (not the cache) before acting."""
        return [PodRef.of(p) for p in await self._gpu_pods_json(node)]

    async def drain(self, node: str, step: StepRef, *, timeout_s: float,
                    dry_run: bool) -> DrainResult:
        run = DrainRun(node=node, step=step, deadline=self._clock() + timeout_s,
                       dry_run=dry_run)
        found = await self._gpu_pods_json(node)
        pods = [PodRef.of(p) for p in found]
        run.waiting = {p.key: p for p in pods}
        run.seen_uids = {p.uid for p in pods}
        if not dry_run:
            # Asked before any eviction: a workload saves its state while it still runs.
            await self._checkpoints(run, found, timeout_s * CHECKPOINT_SHARE)
        await self._evict_all(pods, run)
        moves = [self._move(p, run) for p in run.evicted]
        if not dry_run:
            moves = await self._placed(run, moves)
        unplaced = [f"{m.namespace}/{m.pod}" for m, p in zip(moves, run.evicted, strict=True)
                    if p.controller_uid is not None and m.replacement is None]
        return DrainResult(node=node, moved=tuple(moves), held=tuple(sorted(run.waiting)),
                           unplaced=tuple(unplaced), dry_run=dry_run)

    @staticmethod
    def _move(pod: PodRef, run: DrainRun) -> PodMove:
        checkpointed = run.checkpoints.get(pod.key, Checkpointed(Checkpoint.NOT_ASKED))
        return PodMove(pod.namespace, pod.name, run.node, pdb_waits=run.pdb_waits.get(pod.key, 0),
                       checkpoint=checkpointed.outcome,
                       checkpoint_step=checkpointed.ack.step if checkpointed.ack else None)

    async def _checkpoints(self, run: DrainRun, pods: list[dict[str, Any]],
                           budget_s: float) -> None:
        """Asks every opted-in pod first, then waits (on the watch) for each answer."""
        plans: dict[str, tuple[PodRef, CheckpointPlan]] = {}
        for pod in pods:
            asked = await self._ask(pod, run.step)
            if asked is not None:
                plans[asked[0].key] = asked
        until = self._clock() + budget_s
        for key, (ref, plan) in plans.items():
            def answer(ref: PodRef = ref, plan: CheckpointPlan = plan) -> Checkpointed | None:
                pod = self._cache.pods.get(ref.key)
                if pod is None or (pod.get("metadata") or {}).get("uid") != ref.uid:
                    return Checkpointed(Checkpoint.TIMED_OUT)  # gone: nothing to wait for
                ack = ack_of(annotations_of(pod), plan.request.id)
                return Checkpointed(Checkpoint.ACKED, ack) if ack is not None else None
            left = min(plan.deadline - self._wall(), until - self._clock())
            run.checkpoints[key] = (await self._cache.wait_for(answer, left)
                                    or Checkpointed(Checkpoint.TIMED_OUT))

    async def _ask(self, pod: dict[str, Any],
                   step: StepRef) -> tuple[PodRef, CheckpointPlan] | None:
        """Writes the checkpoint request on an opted-in pod unless it already carries this
        step's own; re-read and decided again if the pod changed meanwhile (409)."""
        ref = PodRef.of(pod)
        for _ in range(CONFLICT_TRIES):
            plan = plan_checkpoint(annotations_of(pod), step, self._wall())
            if plan is None or not plan.ask:
                return (ref, plan) if plan is not None else None
            body = request_patch(plan.request, (pod.get("metadata") or {}).get(
                "resourceVersion", ""))
            try:
                await call(f"ask pod {ref.key} to checkpoint",
                           lambda b=body: merge_patch_pod(  # type: ignore[misc]
                               self._api, ref.namespace, ref.name, b))
                return ref, plan
            except ApiException as err:
                if err.status == 404:
                    return None
                if err.status != 409:
                    raise BackendError(f"ask pod {ref.key} to checkpoint: {err.status} "
                                       f"{err.reason}") from err
            try:
                pod = as_json(self._api, await call(
                    f"read pod {ref.key}",
                    lambda: self._core.read_namespaced_pod(ref.name, ref.namespace)))
            except ApiException as err:
                if err.status == 404:
                    return None
                raise BackendError(f"read pod {ref.key}: {err.status} {err.reason}") from err
            if (pod.get("metadata") or {}).get("uid") != ref.uid:
                return None  # gone, and its controller made another of the same name
        raise BackendError(f"pod {ref.key} kept changing under {CONFLICT_TRIES} attempts "
                           "to ask it to checkpoint")

    async def _evict_all(self, pods: list[PodRef], run: DrainRun) -> None:
        """Every pod's eviction side by side, so the cluster's budget is the only pace: one
        after another, each eviction's answer and each PDB wait would hold back the next, and
        the drain would evict below the budget."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._evict_until_let(pod, run)) for pod in pods]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None  # the step fails as on its first error
        for pod, task in zip(pods, tasks, strict=True):  # in the node's order, not the answers'
            if task.result():
                del run.waiting[pod.key]
                run.evicted.append(pod)

    async def _evict_until_let(self, pod: PodRef, run: DrainRun) -> bool:
        """True once the pod is evicted (or gone); False if a PDB still holds it at the
        deadline (a dry run asks once)."""
        while not await self._evict(pod, run):
            left = run.deadline - self._clock()
            if run.dry_run or left <= 0:
                return False
            await self._sleep(min(PDB_RETRY_S, left))
        return True

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
            placed.append(replace(move, replacement=replacement.name, to_node=replacement.node,
                                  resumed_from=await self._resumed(replacement, move, run)))
        return placed

    async def _resumed(self, replacement: PodRef, move: PodMove, run: DrainRun) -> int | None:
        """The step the replacement says it resumed from: read at once, and waited for a
        little when its workload acknowledged a checkpoint (it speaks the protocol)."""
        def said() -> int | None:
            pod = self._cache.pods.get(replacement.key)
            return resumed_from(annotations_of(pod)) if pod is not None else None
        if move.checkpoint is not Checkpoint.ACKED:
            return said()
        left = min(RESUME_REPORT_S, run.deadline - self._clock())
        return await self._cache.wait_for(said, left)
