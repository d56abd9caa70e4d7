"""The centre's own actions: guards on fresh state, capacity changes, job moves, releases.

A step an agent cannot carry out alone runs here. Adding capacity asks the provider; removing
it, or moving jobs, splits the step into child tasks (one per node to remove, one per job to
move) that go through the scheduler like any task, with their own locks and retries, and the
parent step ends when the last child does. Plans come from `planning` (pure) on a fresh
`ClusterView`; every result of a run is kept per command id, so a re-run after a crash
returns the same plan and the same children instead of planning again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast
from uuid import UUID, uuid5

from pydantic import TypeAdapter
from redis.asyncio import Redis

from common.clock import Clock
from common.signing import (
    SHARED_STEM,
    ensure_signer_keys,
    key_id,
    load_private_key,
    role_of,
    write_public_key,
)
from schemas import ids
from schemas.envelope import short_text
from schemas.events.v1 import (
    AddCapacity,
    DrainNode,
    MigrateJob,
    MigrateJobs,
    OpsTask,
    OutputValue,
    ReleaseNode,
    RemoveCapacity,
    RestartAgent,
    StartJob,
    Step,
    now_utc,
)
from services.capacity.provider import (
    CapacityProvider,
    NodeOffer,
    NotSupportedError,
    ProviderContext,
    build_provider,
)
from services.capacity.settings import CapacitySettings
from services.executor.cluster_view import ClusterView
from services.executor.planning import (
    Move,
    NodeView,
    PoolView,
    capacity_plan,
    evacuation_moves,
    guard_holds,
    moves_text,
    rebalance_moves,
    removal_order,
    standby_order,
)
from services.executor.ports import CentreResult, Completed, Failed, GuardCheck, Waiting
from services.executor.settings import ExecutorSettings
from services.shared.locks import job_lock, node_lock
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.executor.centre")
_OUTPUTS = TypeAdapter(dict[str, OutputValue])
# A remove-node child moves every job of its node, however many (the schema's maximum).
EVACUATE_ALL = 64
# Task kinds whose migrate_jobs step on their own target empties a node leaving service.
LEAVING_KINDS: frozenset[str] = frozenset({"offline", "remove_node"})


def child_task_id(parent: OpsTask, index: int, command_id: UUID, kind: str, name: str) -> UUID:
    """A child's id: the same step attempt planning the same job or node gives the same id,
    so a re-published child is deduplicated; another attempt gets new children."""
    return uuid5(ids.CENTRE_CHILDREN, f"{parent.task_id}:{index}:{command_id}:{kind}:{name}")


class Centre:
    """Checks guards and runs centre actions for the executor."""

    def __init__(
        self,
        view: ClusterView,
        provider: CapacityProvider,
        settings: CapacitySettings | None = None,
        *,
        source: str = "executor",
        clock: Clock = now_utc,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self.provider = provider
        self.settings = settings or CapacitySettings()
        self.source = source
        self.clock = clock
        self.sleep = sleep
        self.monotonic = monotonic  # for waits (with `sleep`): never goes back

    # ------------------------------------------------------------ guards

    async def check_guard(self, task: OpsTask, step: Step) -> GuardCheck:
        """Whether the step's guard holds on fresh state, and why (or why not)."""
        if step.guard is None:
            return GuardCheck(True, "no guard")
        cluster = task.cluster_id
        pool_name = cast(str, getattr(step.action, "pool", None) or task.pool)
        pool = await self._pool(task, pool_name)
        node_id = getattr(step.action, "node_id", None) or task.target
        node = await self.view.node(cluster, node_id) if step.guard == "node_has_jobs" else None
        # The ranges the need was raised under, carried by the task (else the defaults).
        ranges = task.ranges_in_force
        return GuardCheck(*guard_holds(step.guard, pool, node, ranges.pool, ranges.node))

    # ------------------------------------------------------------ actions

    async def run(self, task: OpsTask, index: int, command_id: UUID,
                  dry_run: bool) -> CentreResult:
        """Carry out step `index`; idempotent per `command_id`.

        With `dry_run` everything is planned and nothing is done: the outputs say what would.
        """
        if not dry_run:
            cached = await self._recall(command_id)
            if cached is not None:
                return cached
        action = task.steps[index].action
        if isinstance(action, AddCapacity):
            result = await self._add_capacity(task, action, command_id, dry_run)
        elif isinstance(action, RemoveCapacity):
            result = await self._remove_capacity(task, index, action, command_id, dry_run)
        elif isinstance(action, MigrateJobs):
            result = await self._migrate_jobs(task, index, action, command_id, dry_run)
        elif isinstance(action, ReleaseNode):
            result = await self._release_node(task, action, command_id, dry_run)
        elif isinstance(action, RestartAgent):
            result = await self._restart_agent(task, action, command_id, dry_run)
        else:
            return Failed(f"not_supported: {action.action} is not a centre action",
                          permanent=True)
        if not dry_run and not isinstance(result, Failed):
            await self._remember(command_id, result)
        return result

    async def _add_capacity(self, task: OpsTask, action: AddCapacity, command_id: UUID,
                            dry_run: bool) -> CentreResult:
        cluster, pool_name = task.cluster_id, action.pool
        pool = await self._pool(task, pool_name)
        try:
            offers = standby_order(await self.provider.standby(cluster, pool_name))
        except Exception as err:
            return _provider_failed("standby", err)
        plan = capacity_plan(pool, offers, task.ranges_in_force.pool, "out",
                             action.nodes, target_pct=self.settings.target_util_pct)
        outputs = plan.outputs() | {"provider": self.provider.name}
        if dry_run:
            return Completed(outputs | {"dry_run": True, "added": 0,
                                        "would_add": short_text(",".join(plan.nodes))})
        if not plan.nodes:
            return Completed(outputs | {"added": 0})
        try:
            added = await self.provider.acquire(cluster, pool_name, list(plan.nodes),
                                                request_id=str(command_id))
        except Exception as err:
            return _provider_failed("acquire", err)
        if len(added) < len(plan.nodes):
            outputs["reason"] = short_text(f"{plan.reason}; only {len(added)} of "
                                           f"{len(plan.nodes)} standby nodes were free")
        ready = await self._wait_up(cluster, pool_name, added)
        return Completed(outputs | {"added": len(added), "added_nodes": short_text(",".join(added)),
                                    "ready": ready})

    async def _remove_capacity(self, task: OpsTask, index: int, action: RemoveCapacity,
                               command_id: UUID, dry_run: bool) -> CentreResult:
        cluster, pool_name = task.cluster_id, action.pool
        pool = await self._pool(task, pool_name)
        try:
            owned = await self.provider.owned(cluster, pool_name)
        except Exception as err:
            return _provider_failed("owned", err)
        # Never the task's own node: an online task must not remove the node it brought back.
        candidates = [NodeOffer(n.node_id, n.gpus) for n in removal_order(pool, owned)
                      if n.node_id != task.target]
        plan = capacity_plan(pool, candidates, task.ranges_in_force.pool, "in",
                             action.nodes, target_pct=self.settings.target_util_pct)
        outputs = plan.outputs() | {"provider": self.provider.name}
        if dry_run:
            return Completed(outputs | {"dry_run": True, "removed": 0,
                                        "would_remove": short_text(",".join(plan.nodes))})
        if not plan.nodes:
            return Completed(outputs | {"removed": 0})
        children = [self.remove_child(task, index, command_id, node, pool_name)
                    for node in plan.nodes]
        return Waiting(children, outputs | {"removing": len(children)})

    async def _migrate_jobs(self, task: OpsTask, index: int, action: MigrateJobs,
                            command_id: UUID, dry_run: bool) -> CentreResult:
        cluster = task.cluster_id
        pool = await self.view.pool(cluster, action.pool)
        band = task.ranges_in_force.node
        unplaced = 0
        if action.node_id is None:
            moves = rebalance_moves(pool, band, action.max_jobs)
            what = f"rebalance of pool {action.pool}"
        else:
            node = await self.view.node(cluster, action.node_id)
            if node is None:
                return Completed({"moved": 0, "reason": f"node {action.node_id} unknown"})
            # A task taking its node out evacuates it even if the node's last report, from
            # before the drain or offline step that just ended, still says it is active.
            leaving = task.kind in LEAVING_KINDS and node.node_id == task.target
            if node.active and node.pool == action.pool and not leaving:
                moves = rebalance_moves(pool, band, action.max_jobs, from_node=node.node_id)
                what = f"rebalance of pool {action.pool} from {node.node_id}"
            else:
                moves, unplaced = evacuation_moves(pool, node, action.max_jobs)
                what = f"evacuation of {node.node_id} ({node.state})"
        outputs: dict[str, OutputValue] = {"planned": len(moves), "moves": moves_text(moves)}
        if unplaced:
            outputs["unplaced"] = unplaced
        if not moves:
            if unplaced:
                # Capacity may come (a capacity step, a node back): worth another attempt.
                return Failed(f"no_destination: no active node of pool {action.pool} can "
                              f"take {unplaced} job(s) of {action.node_id}", permanent=False)
            return Completed(outputs | {"moved": 0, "reason": f"{what}: no job to move"})
        reason = f"{what}: {len(moves)} job(s) to move"
        if unplaced:
            reason += f", {unplaced} with no destination"
        outputs["reason"] = short_text(reason)
        if dry_run:
            return Completed(outputs | {"dry_run": True, "moved": 0})
        children = [self.migrate_child(task, index, command_id, move, action.pool)
                    for move in moves]
        return Waiting(children, outputs)

    async def _release_node(self, task: OpsTask, action: ReleaseNode, command_id: UUID,
                            dry_run: bool) -> CentreResult:
        node = await self.view.node(task.cluster_id, action.node_id)
        if node is not None and node.owned_jobs:
            # Its last report may predate the moves: the next one will tell (retried).
            return Failed(f"node_has_jobs: {node.node_id} still owns {node.owned_jobs} "
                          "job(s)", permanent=False)
        if node is not None and node.active:
            return Failed(f"node_not_drained: {node.node_id} still accepts work",
                          permanent=False)
        if dry_run:
            return Completed({"dry_run": True, "released": False,
                              "would_release": action.node_id})
        try:
            released = await self.provider.release(task.cluster_id, action.node_id,
                                                   request_id=str(command_id))
        except Exception as err:
            return _provider_failed("release", err)
        reason = ("stopped and unenrolled" if released
                  else f"not added by the {self.provider.name} provider: left drained")
        return Completed({"released": released, "node": action.node_id, "reason": reason})

    async def _restart_agent(self, task: OpsTask, action: RestartAgent, command_id: UUID,
                             dry_run: bool) -> CentreResult:
        """Start the node's agent again, then wait (bounded) for its first report."""
        cluster, node_id = task.cluster_id, action.node_id
        before = await self.view.last_report(cluster, node_id)
        node = await self.view.node(cluster, node_id)
        if node is not None and node.state == "up":
            # It came back on its own (or a re-run after the restart): nothing to do.
            return Completed({"restarted": False, "node": node_id,
                              "reason": "the node reports again"})
        if dry_run:
            return Completed({"dry_run": True, "restarted": False, "would_restart": node_id})
        try:
            await self.provider.restart_agent(cluster, node_id, request_id=str(command_id))
        except NotSupportedError as err:
            return Failed(short_text(f"not_supported: {err.detail}"), permanent=True)
        except Exception as err:
            return _provider_failed("restart_agent", err)
        if not await self._wait_report(cluster, node_id, before):
            # Started, not reporting: another attempt restarts it again.
            return Failed(f"agent_not_reporting: {node_id} sent no report within "
                          f"{self.settings.restart_timeout_s:.0f}s of its restart",
                          permanent=False)
        return Completed({"restarted": True, "node": node_id, "provider": self.provider.name,
                          "reason": "the agent reports again"})

    async def _wait_report(self, cluster: str, node_id: str, before: float | None) -> bool:
        """Wait until the node sends a report newer than `before` (its last one)."""
        deadline = self.monotonic() + self.settings.restart_timeout_s
        while True:
            last = await self.view.last_report(cluster, node_id)
            if last is not None and (before is None or last > before):
                return True
            if self.monotonic() >= deadline:
                return False
            await self.sleep(0.5)

    # ------------------------------------------------------------ children

    def migrate_child(self, parent: OpsTask, index: int, command_id: UUID, move: Move,
                      pool: str) -> OpsTask:
        """One job's move: checkpoint and stop it on its node, start it from the checkpoint
        on the destination. Locks the job and the destination; the source node is already
        locked by the parent (or is the parent's subject). Sibling moves out of one node run
        side by side: agents fence job commands per job, so one sibling's newer epoch does
        not make another's commands stale.
        """
        job, src, dst = move
        cluster = parent.cluster_id
        mutex = [job_lock(cluster, job.job_id), node_lock(cluster, dst)]
        settings = self.settings
        task_id = child_task_id(parent, index, command_id, "migrate", job.job_id)
        steps = [
            Step(index=0, name="migrate-out",
                 action=MigrateJob(node_id=src, job_id=job.job_id, to_node_id=dst,
                                   checkpoint_timeout_s=settings.checkpoint_timeout_s),
                 timeout_s=max(settings.migrate_step_timeout_s,
                               settings.checkpoint_timeout_s + 10.0)),
            Step(index=1, name="start",
                 action=StartJob(node_id=dst, job_id=job.job_id, kind=job.kind,
                                 checkpoint=job.job_id),
                 timeout_s=settings.start_step_timeout_s),
        ]
        return self._child(parent, task_id, "migrate", job.job_id, pool, mutex, steps)

    def remove_child(self, parent: OpsTask, index: int, command_id: UUID, node: str,
                     pool: str) -> OpsTask:
        """One node's removal: drain it, move its jobs out, hand it back to the provider."""
        settings = self.settings
        task_id = child_task_id(parent, index, command_id, "remove", node)
        steps = [
            Step(index=0, name="drain", action=DrainNode(node_id=node),
                 timeout_s=settings.drain_step_timeout_s),
            Step(index=1, name="migrate-jobs",
                 action=MigrateJobs(pool=pool, node_id=node, max_jobs=EVACUATE_ALL),
                 guard="node_has_jobs", timeout_s=settings.children_step_timeout_s),
            Step(index=2, name="release", action=ReleaseNode(node_id=node),
                 timeout_s=settings.release_step_timeout_s),
        ]
        return self._child(parent, task_id, "remove_node", node, pool,
                           [node_lock(parent.cluster_id, node)], steps)

    def _child(self, parent: OpsTask, task_id: UUID, action_type: str, target: str,
               pool: str, mutex: list[str], steps: list[Step]) -> OpsTask:
        suffix = "migrate" if action_type == "migrate" else "remove"
        return OpsTask(
            event_id=uuid5(ids.CENTRE_CHILDREN, f"{task_id}:created"),
            source=self.source,
            occurred_at=self.clock(),
            cluster_id=parent.cluster_id,
            subject=target,
            correlation_id=str(parent.task_id),
            task_id=task_id,
            parent_task_id=parent.task_id,
            need_id=parent.need_id,
            need_kind=parent.need_kind,
            template=f"{parent.template[:128 - len(suffix) - 1]}.{suffix}",
            action_type=action_type,
            pool=pool,
            target=target,
            priority=parent.priority,
            mutex_keys=mutex,
            dry_run=parent.dry_run,
            steps=steps,
            evidence=list(parent.evidence),
            ranges=parent.ranges,
        )

    # ------------------------------------------------------------ helpers

    async def _pool(self, task: OpsTask, pool: str) -> PoolView:
        """The pool, counting in the jobs of the task's node if it is leaving the pool."""
        view = await self.view.pool(task.cluster_id, pool)
        leaving: NodeView | None = await self.view.node(task.cluster_id, task.target)
        return view.with_incoming(leaving)

    async def _wait_up(self, cluster: str, pool: str, nodes: list[str]) -> bool:
        """Wait (bounded) until new nodes report up, so the next step can place jobs there."""
        if not nodes:
            return True
        deadline = self.monotonic() + self.settings.ready_timeout_s
        while True:
            view = await self.view.pool(cluster, pool)
            if all(view.node(n) is not None for n in nodes):
                return True
            if self.monotonic() >= deadline:
                log.warning("nodes %s not up in %s/%s after %.0fs", nodes, cluster, pool,
                            self.settings.ready_timeout_s)
                return False
            await self.sleep(0.5)

    def _result_key(self, command_id: UUID) -> str:
        return self.view.keys.centre_result(str(command_id))

    async def _recall(self, command_id: UUID) -> CentreResult | None:
        raw = await self.view.redis.get(self._result_key(command_id))
        if raw is None:
            return None
        data: dict[str, Any] = json.loads(text(raw))
        outputs = _OUTPUTS.validate_python(data.get("outputs", {}))
        if data["kind"] == "waiting":
            children = [OpsTask.model_validate_json(child) for child in data["children"]]
            return Waiting(children, outputs)
        return Completed(outputs)

    async def _remember(self, command_id: UUID, result: Completed | Waiting) -> None:
        data: dict[str, Any] = {"kind": "completed", "outputs": result.outputs}
        if isinstance(result, Waiting):
            data = {"kind": "waiting", "outputs": result.outputs,
                    "children": [child.model_dump_json() for child in result.children]}
        await self.view.redis.set(self._result_key(command_id), json.dumps(data),
                                  ex=self.settings.result_ttl_s)


def _provider_failed(call: str, err: Exception) -> Failed:
    log.warning("capacity provider %s failed: %s", call, err)
    return Failed(short_text(f"provider_error: {call}: {err}"), permanent=False)


# ---------------------------------------------------------------- wiring

# What a standby agent inherits from the executor's environment (the fleet sets the rest).
_AGENT_ENV_PREFIXES = ("WARDEN_", "KAFKA_", "AGENT_", "OTEL_")
_AGENT_ENV_NAMES = ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")


def agent_environment(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(_AGENT_ENV_PREFIXES) or k in _AGENT_ENV_NAMES}


def signer_public_keys(signing_key: str, state_dir: str) -> tuple[Path, ...]:
    """The public keys the agents the executor starts trust: every signer's of the state
    folder, the executor's own taken from its configured key when it has one."""
    keys = Path(state_dir).resolve() / "keys"
    trusted = ensure_signer_keys(keys)
    if not signing_key:
        return tuple(trusted)
    public = load_private_key(Path(signing_key)).public_key()
    # Named for its role and its id: trusted for the executor's actions only, or for every
    # action if it is the one key all signers share.
    shared = Path(signing_key).name.split(".", 1)[0] == SHARED_STEM
    path = keys / f"{SHARED_STEM if shared else 'executor'}.{key_id(public)}.pub"
    if not path.exists():
        write_public_key(path, public)
    return (path, *(p for p in trusted if role_of(p) != "executor"))


def build_centre(settings: ExecutorSettings, redis: Redis, keys: Keys) -> Centre:
    """The centre the executor runs: CAPACITY_* settings; ranges come with each task."""
    capacity = CapacitySettings()
    context = ProviderContext(
        redis=redis, keys=keys, settings=capacity,
        state_dir=Path(settings.state_dir).resolve(), namespace=settings.namespace,
        env=agent_environment(os.environ),
        trusted_keys=signer_public_keys(settings.signing_key, settings.state_dir),
    )
    return Centre(ClusterView(redis, keys), build_provider(context), capacity)
