"""Node steps carried out through a cluster's backend instead of a signed agent command.

A cluster registered with the `kubernetes` backend (services/shared/registry.py) has its
`drain_node`, `offline_node`, `online_node`, `undrain_node`, `migrate_jobs`, `add_capacity` and
`remove_capacity` steps carried out here, through its API server, and settled like a centre
action (Completed / Failed). Everything around the step is the workflow's as for any other:
the journal's compare-and-set, the task's epoch, its locks, budgets, rate limits, breakers,
retries, deadlines and dry run. Every write names the task and the step (`StepRef`) and the
backend re-reads before acting, so a re-run after a crash, or the deadline sweep running a
step again, changes nothing that was done.

What each result means to the step (`settle_node`, `settle_drain`, pure):
* applied / already / dry run: completed, the outputs say which;
* refused (someone else owns the node, e.g. a person cordoned it): failed **permanently**,
  the reason quotes why; nothing was changed and no retry will change it;
* a drain with pods still held by a PodDisruptionBudget, or without a replacement Running
  elsewhere, when its time ran out: failed, retried (the next attempt evicts only what is
  left);
* a capacity step completes with the nodes added or given back (or a MachineDeployment's
  replicas before and after); one whose nodes are still draining when its time ran out
  fails, retried;
* forbidden credentials or an operation the backend does not carry out: failed permanently;
  the API server unreachable: failed, retried after the backoff (fail closed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

from redis.asyncio import Redis

from common.clock import EpochClock
from schemas.envelope import short_text
from schemas.events.v1 import (
    AddCapacity,
    DrainNode,
    HealthCheck,
    MigrateJobs,
    OfflineNode,
    OnlineNode,
    OpsTask,
    OutputValue,
    RemoveCapacity,
    Step,
    UndrainNode,
)
from services.backends.base import (
    Backend,
    BackendError,
    BackendForbidden,
    BackendUnsupported,
    CapacityResult,
    Checkpoint,
    DrainResult,
    Inventory,
    NodeResult,
    Outcome,
    StepRef,
)
from services.backends.opened import OpenedBackends, Opener
from services.executor.cluster_view import ClusterView
from services.executor.health import RECHECK_S, judge
from services.executor.ports import CentreResult, Completed, Failed
from services.shared.redis_client import Keys
from services.shared.registry import (
    backend_clusters,
    cluster_backend,
    deregister_nodes,
    register_nodes,
)

log = logging.getLogger("clusterwarden.executor.backends")

BACKEND_ACTIONS = (DrainNode, UndrainNode, OfflineNode, OnlineNode, MigrateJobs, AddCapacity,
                   RemoveCapacity)
# A step's backend call must end before the step's deadline, or the deadline sweep would run
# the step again beside it: the drain gets this share of the step's time.
DRAIN_SHARE = 0.8

def step_ref(task: OpsTask, index: int) -> StepRef:
    """What a backend's writes record: the task and its step (index and name)."""
    return StepRef(task_id=str(task.task_id), step=f"{index}:{task.steps[index].name}")


def task_reason(task: OpsTask) -> str:
    """Why the task takes the node out, as a taint value and the claim will say it."""
    first = task.evidence[0] if task.evidence else None
    detail = (first.detail or first.metric) if first is not None else ""
    return f"{task.need_kind} {detail}".strip() if detail else str(task.need_kind)


def schedulable_gpus(inventory: Inventory) -> int:
    """The GPUs new pods can be placed on: allocatable on schedulable, Ready nodes."""
    return sum(n.allocatable for n in inventory.nodes if n.schedulable and n.ready)


def settle_node(result: NodeResult, action: str) -> CentreResult:
    """A node operation's result as the step's end."""
    if result.outcome is Outcome.REFUSED:
        return Failed(short_text(f"refused: {action} of {result.node}: {result.detail}"),
                      permanent=True)
    outputs: dict[str, OutputValue] = {"backend": "kubernetes", "node": result.node,
                                       "outcome": result.outcome.value}
    if result.detail:
        outputs["detail"] = short_text(result.detail)
    if result.outcome is Outcome.DRY_RUN:
        outputs["dry_run"] = True
    return Completed(outputs)


def moves_text(result: DrainResult) -> str:
    """Each evicted pod and where its replacement runs: `ns/pod->node` (`?` for none)."""
    return ",".join(f"{m.namespace}/{m.pod}->{m.to_node or '?'}" for m in result.moved)


def checkpoints_text(result: DrainResult) -> str:
    """Each asked pod's checkpoint: `ns/pod@<step saved>` or `ns/pod@timed_out`, and
    `>resumed@<step>` when its replacement said where it resumed."""
    parts = []
    for m in result.moved:
        if m.checkpoint is Checkpoint.NOT_ASKED:
            continue
        saved = m.checkpoint_step if m.checkpoint_step is not None else m.checkpoint.value
        resumed = f">resumed@{m.resumed_from}" if m.resumed_from is not None else ""
        parts.append(f"{m.namespace}/{m.pod}@{saved}{resumed}")
    return ",".join(parts)


def checkpoint_outputs(result: DrainResult) -> dict[str, OutputValue]:
    """What the task record shows of the checkpoints: how many acknowledged and timed out,
    and from which step each pod's workload goes on."""
    acked = [m for m in result.moved if m.checkpoint is Checkpoint.ACKED]
    timed_out = [m for m in result.moved if m.checkpoint is Checkpoint.TIMED_OUT]
    if not acked and not timed_out:
        return {}
    return {"checkpoints_acked": len(acked), "checkpoints_timed_out": len(timed_out),
            "checkpoints": short_text(checkpoints_text(result))}


def settle_drain(result: DrainResult, gpus_before: int, gpus_after: int) -> CentreResult:
    """A drain's result as the step's end; the outputs keep the schedulable GPUs before and
    after, and where each replacement runs."""
    if result.refused:
        return Failed(short_text(f"refused: drain of {result.node}: {result.refused}"),
                      permanent=True)
    outputs: dict[str, OutputValue] = {
        "backend": "kubernetes", "node": result.node, "evicted": len(result.moved),
        "moves": short_text(moves_text(result)),
        "pdb_waits": sum(m.pdb_waits for m in result.moved),
        "replacements_on": short_text(",".join(sorted({m.to_node for m in result.moved
                                                       if m.to_node}))),
        "gpus_schedulable_before": gpus_before, "gpus_schedulable_after": gpus_after,
        **checkpoint_outputs(result),
    }
    if result.dry_run:
        # Nothing was evicted, so no replacement can run: what the dry run tells is which
        # pods would go and which a PodDisruptionBudget would hold now.
        return Completed(outputs | {"dry_run": True, "would_evict": len(result.moved),
                                    "held": len(result.held)})
    if result.complete:
        return Completed(outputs)
    parts = []
    if result.held:
        parts.append(f"{len(result.held)} pod(s) still held by a PodDisruptionBudget: "
                     f"{','.join(result.held)}")
    if result.unplaced:
        parts.append(f"{len(result.unplaced)} evicted pod(s) without a replacement Running "
                     f"elsewhere: {','.join(result.unplaced)}")
    return Failed(short_text(f"drain_incomplete: {result.node}: {'; '.join(parts)}"),
                  permanent=False)


def settle_capacity(result: CapacityResult, action: str, gpus_before: int,
                    gpus_after: int) -> CentreResult:
    """A capacity step's result as its end: the nodes added or given back (or the node
    group's replicas), and the schedulable GPUs before and after. Nodes still draining when
    the step's time ran out fail the attempt, retried (the next one carries on with them)."""
    verb, done = ("add", "added") if action == "add_capacity" else ("remove", "removed")
    outputs: dict[str, OutputValue] = {
        "backend": "kubernetes", "outcome": result.outcome.value, done: len(result.nodes),
        f"{done}_nodes": short_text(",".join(result.nodes)),
        "gpus_schedulable_before": gpus_before, "gpus_schedulable_after": gpus_after,
    }
    if result.replicas is not None:
        outputs |= {"replicas_before": result.replicas[0], "replicas_after": result.replicas[1]}
    if result.detail:
        outputs["reason"] = short_text(result.detail)
    if result.outcome is Outcome.DRY_RUN:
        # Nothing changed: what the dry run tells is which nodes the step would take.
        outputs |= {"dry_run": True, done: 0, f"would_{verb}": outputs[f"{done}_nodes"]}
    if result.held:
        return Failed(short_text(f"capacity_incomplete: {action} of pool {result.pool}: "
                                 f"{result.detail}"), permanent=False)
    return Completed(outputs)


class ClusterBackends:
    """Runs steps of non-local clusters through their backend; one opened backend (its
    watches, its eviction budget) per cluster, kept for the process's life."""

    def __init__(self, redis: Redis, keys: Keys, *,
                 openers: dict[str, Opener] | None = None, clock: EpochClock = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.redis = redis
        self.keys = keys
        self.view = ClusterView(redis, keys)
        self.clock = clock
        self.sleep = sleep
        self.opened = OpenedBackends(redis, keys, openers=openers)

    async def handles(self, task: OpsTask, step: Step) -> bool:
        if not isinstance(step.action, BACKEND_ACTIONS):
            return False
        config = await cluster_backend(self.redis, self.keys, task.cluster_id)
        return config.kind != "local"

    async def backend(self, cluster: str) -> Backend:
        """The cluster's opened backend (opened again if its registration changed)."""
        return await self.opened.backend(cluster)

    async def warm(self) -> None:
        """Opens the backend of every cluster registered with one, before a step needs it:
        opening lists the cluster's nodes and pods, and at 1,000 nodes decoding those lists
        holds the event loop for over a second, which the first fault's drains (and every
        task the executor received meanwhile) waited out."""
        for cluster in await backend_clusters(self.redis, self.keys):
            try:
                await self.opened.backend(cluster)
            except Exception:  # one unreachable cluster must not keep the others closed
                log.exception("opening the backend of cluster %s failed; next try soon",
                              cluster)

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        action = task.steps[index].action.action
        try:
            backend = await self.backend(task.cluster_id)
            return await self._carry_out(backend, task, index, dry_run)
        except BackendForbidden as err:
            return Failed(short_text(f"forbidden: {err}"), permanent=True)
        except BackendUnsupported as err:
            return Failed(short_text(f"not_supported: {err}"), permanent=True)
        except BackendError as err:
            # Fail closed: nothing is assumed done; the retry re-reads and carries on.
            log.warning("task %s step %d (%s): %s", task.task_id, index, action, err)
            return Failed(short_text(f"backend_unreachable: {err}"), permanent=False)

    async def _carry_out(self, backend: Backend, task: OpsTask, index: int,
                         dry_run: bool) -> CentreResult:
        step = task.steps[index]
        action, ref = step.action, step_ref(task, index)
        if isinstance(action, OfflineNode):
            return settle_node(await backend.offline_node(
                action.node_id, ref, task_reason(task), effect=action.effect,
                dry_run=dry_run), "offline")
        if isinstance(action, OnlineNode) and action.health_check is not None:
            return await self._online_when_healthy(backend, task, index, action.health_check,
                                                   dry_run)
        if isinstance(action, OnlineNode | UndrainNode):
            # Undrain undoes a drain's cordon and claim: what online undoes.
            return settle_node(await backend.online_node(action.node_id, ref, dry_run=dry_run),
                               action.action)
        if isinstance(action, DrainNode):
            return await self._drain(backend, task, action.node_id, index, dry_run)
        if isinstance(action, MigrateJobs):
            if action.node_id is None:
                return Completed({"backend": "kubernetes", "moved": 0,
                                  "reason": "the cluster's scheduler places pods; running "
                                            "pods are not moved to rebalance"})
            # Moving a node's jobs out is its drain: evicted pods come back elsewhere through
            # their controllers; a drained node has nothing left to evict.
            return await self._drain(backend, task, action.node_id, index, dry_run)
        if isinstance(action, AddCapacity | RemoveCapacity):
            return await self._capacity(backend, task, index, dry_run)
        return Failed(f"not_supported: {action.action} through the backend", permanent=True)

    async def _capacity(self, backend: Backend, task: OpsTask, index: int,
                        dry_run: bool) -> CentreResult:
        """`nodes` 0 lets the backend size the change: on Kubernetes, enough for the pending
        GPU pods (the queued demand) when adding, the idle nodes it added when removing."""
        step = task.steps[index]
        action, ref = step.action, step_ref(task, index)
        before = schedulable_gpus(await backend.inventory())
        if isinstance(action, AddCapacity):
            result = await backend.add_capacity(action.pool, action.nodes, ref,
                                                timeout_s=step.timeout_s * DRAIN_SHARE,
                                                dry_run=dry_run)
            if not dry_run and result.nodes:
                # Enrolled as the local provider enrols its nodes: their agents' reports count.
                await register_nodes(self.redis, self.keys, task.cluster_id, result.nodes)
        else:
            assert isinstance(action, RemoveCapacity)
            result = await backend.remove_capacity(
                action.pool, (), ref, count=action.nodes,
                timeout_s=step.timeout_s * DRAIN_SHARE, dry_run=dry_run)
            if not dry_run and result.nodes:
                await deregister_nodes(self.redis, self.keys, task.cluster_id, result.nodes)
        after = schedulable_gpus(await backend.inventory())
        return settle_capacity(result, action.action, before, after)

    async def _online_when_healthy(self, backend: Backend, task: OpsTask, index: int,
                                   check: HealthCheck, dry_run: bool) -> CentreResult:
        """Online only once the node passes the template's health check (health.py); until
        then it stays cordoned and the step waits, within its share of the step's time, then
        fails retryably with the reason. A dry run judges once and does not wait."""
        step = task.steps[index]
        assert isinstance(step.action, OnlineNode)
        node = step.action.node_id
        started = self.clock()
        deadline = started + step.timeout_s * DRAIN_SHARE
        while True:
            inventory = await backend.inventory()
            conditions = next((n.conditions for n in inventory.nodes if n.name == node), None)
            agent = await self.view.agent_health(task.cluster_id, node)
            verdict = judge(check, conditions, agent, self.clock())
            if verdict.clear or dry_run:
                break
            left = deadline - self.clock()
            if left <= 0:
                return Failed(short_text(
                    f"health_check: {node} not healthy after {self.clock() - started:.0f} s: "
                    f"{verdict.reason}"), permanent=False)
            await self.sleep(min(verdict.recheck_s, RECHECK_S, left))
        result = settle_node(await backend.online_node(node, step_ref(task, index),
                                                       dry_run=dry_run), step.action.action)
        if not isinstance(result, Completed):
            return result
        return Completed(result.outputs | {
            "health": "clear" if verdict.clear else short_text(verdict.reason),
            "health_waited_s": round(self.clock() - started, 1)})

    async def _drain(self, backend: Backend, task: OpsTask, node: str, index: int,
                     dry_run: bool) -> CentreResult:
        step = task.steps[index]
        before = schedulable_gpus(await backend.inventory())
        result = await backend.drain_node(node, step_ref(task, index),
                                          timeout_s=step.timeout_s * DRAIN_SHARE,
                                          reason=task_reason(task), dry_run=dry_run)
        after = schedulable_gpus(await backend.inventory())
        return settle_drain(result, before, after)

    async def close(self) -> None:
        await self.opened.close()
