"""Capacity on Kubernetes, the I/O half: the standby pool and Cluster API MachineDeployments
behind `add_capacity` / `remove_capacity`. What to do is decided in capacity.py (pure); here
each node or MachineDeployment is re-read, decided on and patched (a 409 re-reads).

Which actuator a cluster uses is in its registration (`ClusterBackend.capacity`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from common.clock import EpochClock
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
    taking,
)
from services.backends.kubernetes.connection import MERGE_PATCH, call, dry_run_args
from services.backends.kubernetes.demand import machines_on_the_way
from services.backends.kubernetes.drain import Drainer
from services.backends.kubernetes.nodes import CONFLICT_TRIES, apply

CapacityKind = Literal["standby", "machinedeployment"]
# How long an add waits for the cache's watch to show the nodes it uncordoned.
SEEN_TIMEOUT_S = 5.0
CAPI_GROUP, CAPI_VERSION, MD_PLURAL = "cluster.x-k8s.io", "v1beta1", "machinedeployments"


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

    async def add(self, pool: str, count: int, step: StepRef, *,
                  dry_run: bool) -> CapacityResult:
        nodes = self._nodes()
        ready = {n.name: n.ready for n in nodes}
        pending = self._cache.inventory().pending_gpus
        mine, take = choose_standby(nodes, pool, step, count, pending)
        added, refused = list(mine), []
        for name in take:
            result = await apply(self._api, name, taking(step, pool, ready[name]),
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
    controllers make (or delete, after draining) the machines; their Nodes join the cluster."""

    def __init__(self, api: client.ApiClient, cache: ClusterCache, namespace: str) -> None:
        self._api = api
        self._custom = client.CustomObjectsApi(api)
        self._cache = cache
        self._namespace = namespace

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

    def _node_gpus(self) -> int:
        """The largest GPU node's allocatable: a new machine's size when the
        MachineDeployment does not say."""
        return max((n.allocatable for n in self._cache.inventory().nodes), default=0)

    async def scale(self, pool: str, step: StepRef, *, add: int = 0, remove: int = 0,
                    dry_run: bool) -> CapacityResult:
        """Adds `add` machines (0: enough for the pending GPU pods) or removes `remove`."""
        what = f"machinedeployment {self._namespace}/{pool}"
        for _ in range(CONFLICT_TRIES):
            md = await self._read(pool)
            if remove:
                delta = -remove
            else:
                size = md.gpus_per_machine or self._node_gpus()
                delta = machines_for(add, self._cache.inventory().pending_gpus, size)
            decision = decide_scale(md, step, delta)
            detail = f"{what} replicas {decision.before} -> {decision.after}"
            if decision.patch is None:
                return CapacityResult(pool, (), _outcome(False, dry_run), detail=detail,
                                      replicas=(decision.before, decision.after))
            try:
                await call(f"patch {what}", partial(self._patch, pool, decision.patch, dry_run))
            except ApiException as err:
                if err.status == 409:
                    continue
                raise BackendError(f"patch {what}: {err.status} {err.reason}") from err
            return CapacityResult(pool, (), _outcome(True, dry_run), detail=detail,
                                  replicas=(decision.before, decision.after))
        raise BackendError(f"{what} kept changing under {CONFLICT_TRIES} attempts to scale it")

    def _patch(self, name: str, body: dict[str, Any], dry_run: bool) -> Any:
        # As for nodes: a JSON merge patch guarded by the resourceVersion in the body.
        patch: Any = self._custom.patch_namespaced_custom_object
        return patch(CAPI_GROUP, CAPI_VERSION, self._namespace, MD_PLURAL, name, body,
                     _content_type=MERGE_PATCH, **dry_run_args(dry_run))
