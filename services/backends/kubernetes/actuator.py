"""Capacity on Kubernetes, the I/O half: the standby pool and Cluster API MachineDeployments
behind `add_capacity` / `remove_capacity`. What to do is decided in capacity.py (pure); here
each node or MachineDeployment is re-read, decided on and patched (a 409 re-reads).

Which actuator a cluster uses is in its registration (`ClusterBackend.capacity`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from common.clock import EpochClock
from schemas.kubernetes import DEPLOYMENT_NAME_LABEL
from services.backends.base import BackendError, CapacityResult, Outcome, StepRef
from services.backends.kubernetes.cache import ClusterCache
from services.backends.kubernetes.capacity import (
    MachineDeploymentView,
    StandbyNode,
    choose_returns,
    choose_standby,
    decide_release,
    decide_return,
    decide_scale,
    machines_for,
    scale_record_of,
    taking,
)
from services.backends.kubernetes.connection import MERGE_PATCH, call, dry_run_args
from services.backends.kubernetes.demand import machines_on_the_way
from services.backends.kubernetes.drain import Drainer
from services.backends.kubernetes.machines import (
    MachineView,
    arrivals,
    choose_removals,
    mark_patch,
    record_patch,
)
from services.backends.kubernetes.nodes import CONFLICT_TRIES, apply

CapacityKind = Literal["standby", "machinedeployment"]
# How long an add waits for the cache's watch to show the nodes it uncordoned.
SEEN_TIMEOUT_S = 5.0
CAPI_GROUP, CAPI_VERSION, MD_PLURAL = "cluster.x-k8s.io", "v1beta1", "machinedeployments"
MACHINE_PLURAL = "machines"
# How often a scale-up reads its pool's Machines while it waits for their Nodes.
MACHINE_POLL_S = 1.0


@dataclass(frozen=True)
class CapacitySource:
    """Where a cluster's capacity comes from: its standby pool, or a MachineDeployment per
    pool (named as the pool, in `namespace`)."""

    kind: CapacityKind = "standby"
    namespace: str = "default"


def _outcome(applied: bool, dry_run: bool) -> Outcome:
    if dry_run:
        return Outcome.DRY_RUN
    return Outcome.APPLIED if applied else Outcome.ALREADY


class StandbyPool:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, drainer: Drainer, *,
                 clock: EpochClock = time.monotonic) -> None:
        self._api = api
        self._cache = cache
        self._drainer = drainer
        self._clock = clock

    def _nodes(self) -> list[StandbyNode]:
        """Every node as the cache has it, with its GPU pods counted."""
        inventory = self._cache.inventory()
        return [StandbyNode.of(n, len(inventory.pods_by_node.get(n["metadata"]["name"], ())))
                for n in self._cache.nodes.values()]

    async def add(self, pool: str, count: int, step: StepRef, *, shortfall_gpus: int,
                  dry_run: bool) -> CapacityResult:
        nodes = self._nodes()
        ready = {n.name: n.ready for n in nodes}
        mine, take, asked = choose_standby(nodes, pool, step, count, shortfall_gpus)
        added, refused = list(mine), []
        for name in take:
            result = await apply(self._api, name, taking(step, pool, ready[name], asked),
                                 dry_run=dry_run)
            if result.outcome is Outcome.REFUSED:
                refused.append(result.detail)  # taken or changed since the cache saw it
            else:
                added.append(name)
        if not dry_run and len(added) > len(mine):
            # The step's record says how many GPUs became schedulable: let the watch see it.
            await self._cache.wait_for(lambda: self._schedulable(added), SEEN_TIMEOUT_S)
        detail = "; ".join(refused)
        if not added:
            detail = detail or f"no free standby node for pool {pool}"
        return CapacityResult(pool, tuple(added), _outcome(len(added) > len(mine), dry_run),
                              detail=detail)

    def _schedulable(self, names: list[str]) -> bool | None:
        nodes = {n.name: n for n in self._nodes()}
        return all(n in nodes and not nodes[n].view.unschedulable for n in names) or None

    async def remove(self, pool: str, names: tuple[str, ...], count: int, step: StepRef, *,
                     timeout_s: float, dry_run: bool) -> CapacityResult:
        """Cordon, drain, then hand back each chosen node; one whose drain does not finish
        in time stays cordoned and marked as going back, for the retry."""
        deadline = self._clock() + timeout_s
        returned: list[str] = []
        held: list[str] = []
        refused: list[str] = []
        for name in choose_returns(self._nodes(), pool, step, names, count):
            cordon = await apply(self._api, name, lambda view: decide_return(view, step),
                                 dry_run=dry_run)
            if cordon.outcome is Outcome.REFUSED:
                refused.append(cordon.detail)
                continue
            drain = await self._drainer.drain(name, step,
                                              timeout_s=max(deadline - self._clock(), 0.0),
                                              dry_run=dry_run)
            if not dry_run and not drain.complete:
                held.append(name)
                continue
            if not dry_run:
                await apply(self._api, name, decide_release, dry_run=False)
            returned.append(name)
        detail = "; ".join(refused)
        if held:
            detail = "; ".join(filter(None, [detail, f"{len(held)} node(s) still draining: "
                                                     f"{','.join(held)}"]))
        return CapacityResult(pool, tuple(returned), _outcome(bool(returned), dry_run),
                              detail=detail, held=tuple(held))


class MachineDeployments:
    """A pool's MachineDeployment, scaled through `spec.replicas`: the Cluster API
    controllers make (or delete, after draining) the machines; their Nodes join the cluster.
    A scale-up waits for the new machines' Nodes and reports them (they are enrolled); a
    scale-down marks the machines to delete first (machines.py chooses them)."""

    def __init__(self, api: client.ApiClient, cache: ClusterCache, namespace: str, *,
                 clock: EpochClock = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._api = api
        self._custom = client.CustomObjectsApi(api)
        self._cache = cache
        self._namespace = namespace
        self._clock = clock
        self._sleep = sleep

    async def find(self, name: str) -> MachineDeploymentView | None:
        """The MachineDeployment named `name` in the capacity namespace, or None."""
        try:
            obj = await call(f"read machinedeployment {self._namespace}/{name}",
                             lambda: self._custom.get_namespaced_custom_object(
                                 CAPI_GROUP, CAPI_VERSION, self._namespace, MD_PLURAL, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return MachineDeploymentView.of(obj)

    async def _read(self, name: str) -> MachineDeploymentView:
        md = await self.find(name)
        if md is None:
            raise BackendError(f"no MachineDeployment {self._namespace}/{name} for pool {name}")
        return md

    async def on_the_way(self, pool: str, default_pool: str) -> int:
        """GPUs of the pool's machines asked for whose Nodes have not arrived (0 without a
        MachineDeployment for the pool)."""
        md = await self.find(pool)
        if md is None:
            return 0
        machines = machines_on_the_way(md.replicas, self._cache.nodes.values(), pool,
                                       default_pool)
        return machines * (md.gpus_per_machine or self._node_gpus())

    async def machines(self, pool: str) -> list[MachineView]:
        """The pool's Machines (those Cluster API labels with its MachineDeployment's name)."""
        what = f"list machines of {self._namespace}/{pool}"
        try:
            answer = await call(what, lambda: self._custom.list_namespaced_custom_object(
                CAPI_GROUP, CAPI_VERSION, self._namespace, MACHINE_PLURAL,
                label_selector=f"{DEPLOYMENT_NAME_LABEL}={pool}"))
        except ApiException as err:
            raise BackendError(f"{what}: {err.status} {err.reason}") from err
        return [MachineView.of(m) for m in answer.get("items") or ()]

    def _node_gpus(self) -> int:
        """The largest GPU node's allocatable: a new machine's size when the
        MachineDeployment does not say."""
        return max((n.allocatable for n in self._cache.inventory().nodes), default=0)

    async def scale_up(self, pool: str, count: int, step: StepRef, *, shortfall_gpus: int,
                       timeout_s: float, dry_run: bool) -> CapacityResult:
        """Adds `count` machines (0: enough for the pool's shortfall of GPUs) and waits up to
        `timeout_s` for their Nodes, which the result names. A resend finds its record on
        the MachineDeployment and adds nothing more."""
        before = {m.name for m in await self.machines(pool)}
        scaled = await self._patch_replicas(
            pool, step, lambda md: self._growth(md, count, shortfall_gpus), dry_run)
        if dry_run or scaled.replicas is None or scaled.replicas[1] <= scaled.replicas[0]:
            return scaled
        if scaled.outcome is Outcome.ALREADY:
            # A resend: the machines made since the first attempt were not there before it.
            before = set()
        return await self._arrivals(pool, step, scaled, before, timeout_s)

    async def scale_down(self, pool: str, count: int, nodes: tuple[str, ...], step: StepRef,
                         *, dry_run: bool) -> CapacityResult:
        """Marks the machines to go (machines.py: `count` of them, 0: the idle ones; only
        those of `nodes` if named), then lowers the replicas by as many."""
        md = await self._read(pool)
        if (record := scale_record_of(md.annotations)) is not None \
                and (record.task_id, record.step) == (step.task_id, step.step):
            return await self._patch_replicas(pool, step, lambda _: 0, dry_run)
        marked = await self._mark(pool, step, count, nodes, dry_run)
        if not marked:
            return CapacityResult(pool, (), _outcome(False, dry_run),
                                  detail=f"no machine of {pool} free to remove")
        result = await self._patch_replicas(pool, step, lambda _: -len(marked), dry_run)
        return replace(result, detail=f"{result.detail}; deleting first: {','.join(marked)}")

    def _growth(self, md: MachineDeploymentView, add: int, shortfall_gpus: int) -> int:
        return machines_for(add, shortfall_gpus, md.gpus_per_machine or self._node_gpus())

    async def _patch_replicas(self, pool: str, step: StepRef,
                              delta_of: Callable[[MachineDeploymentView], int],
                              dry_run: bool) -> CapacityResult:
        what = f"machinedeployment {self._namespace}/{pool}"
        for _ in range(CONFLICT_TRIES):
            md = await self._read(pool)
            decision = decide_scale(md, step, delta_of(md))
            detail = f"{what} replicas {decision.before} -> {decision.after}"
            if decision.patch is None:
                return CapacityResult(pool, (), _outcome(False, dry_run), detail=detail,
                                      replicas=(decision.before, decision.after))
            try:
                await call(f"patch {what}", partial(self._patch, MD_PLURAL, pool,
                                                    decision.patch, dry_run))
            except ApiException as err:
                if err.status == 409:
                    continue
                raise BackendError(f"patch {what}: {err.status} {err.reason}") from err
            return CapacityResult(pool, (), _outcome(True, dry_run), detail=detail,
                                  replicas=(decision.before, decision.after))
        raise BackendError(f"{what} kept changing under {CONFLICT_TRIES} attempts to scale it")

    async def _arrivals(self, pool: str, step: StepRef, scaled: CapacityResult,
                        before: set[str], timeout_s: float) -> CapacityResult:
        """Waits for the new machines' Nodes (the Machines read each second, the Nodes from
        the watch), recording each machine as this step's; the ones not there in time are
        `held`, so the step fails and its retry waits on."""
        assert scaled.replicas is not None
        wanted = scaled.replicas[1] - scaled.replicas[0]
        deadline = self._clock() + timeout_s
        while True:
            found = arrivals(await self.machines(pool), step, before,
                             {n["metadata"]["name"] for n in self._cache.nodes.values()},
                             wanted)
            recorded = [m for m in found.to_record if await self._record(m, step, pool)]
            mine = [*found.mine, *recorded]
            missing = wanted - len(mine)
            if missing <= 0 or self._clock() >= deadline:
                break
            await self._sleep(min(MACHINE_POLL_S, max(deadline - self._clock(), 0.0)))
        nodes = tuple(sorted(m.node for m in mine if m.node))
        if missing <= 0:
            return replace(scaled, nodes=nodes)
        held = found.waiting or (f"{missing} machine(s) not made yet",)
        return replace(scaled, nodes=nodes, held=held,
                       detail=f"{scaled.detail}; {missing} new machine(s) without a Node yet")

    async def _record(self, machine: MachineView, step: StepRef, pool: str) -> bool:
        """Records the step on a new machine; False if it changed meanwhile (read again on
        the next round)."""
        try:
            await call(f"annotate machine {machine.name}", partial(
                self._patch, MACHINE_PLURAL, machine.name, record_patch(machine, step, pool),
                False))
        except ApiException as err:
            if err.status in (404, 409):
                return False
            raise BackendError(f"annotate machine {machine.name}: {err.status} "
                               f"{err.reason}") from err
        return True

    async def _mark(self, pool: str, step: StepRef, count: int, nodes: tuple[str, ...],
                    dry_run: bool) -> list[str]:
        """Marks the chosen machines for deletion first; answers the machines marked (this
        step's, earlier attempts' included)."""
        gpu_pods = {n: len(p) for n, p in self._cache.inventory().pods_by_node.items()}
        for _ in range(CONFLICT_TRIES):
            machines = {m.name: m for m in await self.machines(pool)}
            chosen = choose_removals(machines.values(), step, count, nodes, gpu_pods)
            marked, changed = [], False
            for name in chosen:
                machine = machines[name]
                patch = mark_patch(machine, step)
                if patch is None:
                    marked.append(name)  # this step's mark, from an earlier attempt
                    continue
                try:
                    await call(f"mark machine {name}", partial(
                        self._patch, MACHINE_PLURAL, name, patch, dry_run))
                except ApiException as err:
                    if err.status not in (404, 409):
                        raise BackendError(f"mark machine {name}: {err.status} "
                                           f"{err.reason}") from err
                    changed = True
                    continue
                marked.append(name)
            if not changed:
                return marked
        raise BackendError(f"the machines of {pool} kept changing under {CONFLICT_TRIES} "
                           "attempts to mark them")

    def _patch(self, plural: str, name: str, body: dict[str, Any], dry_run: bool) -> Any:
        # As for nodes: a JSON merge patch guarded by the resourceVersion in the body.
        patch: Any = self._custom.patch_namespaced_custom_object
        return patch(CAPI_GROUP, CAPI_VERSION, self._namespace, plural, name, body,
                     _content_type=MERGE_PATCH, **dry_run_args(dry_run))
