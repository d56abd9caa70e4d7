"""The job actions: migrate_job, start_job, stop_job and set_resources on one node.

Each action first decides from fresh state, changing nothing (so a dry run and an injected
failure stay side-effect free), and re-checks its precondition there rather than trusting
the centre's view: the job may have moved or ended since the centre looked. Each is
idempotent: repeating a done action succeeds with `changed: false`.

What waits for a job process (a checkpoint, an exit) runs in the background as a coroutine,
never blocking the report loop; the command's result is published when it is done. Such a
coroutine decides again when it starts, on the state of that moment (another action may
have taken the job in between), and holds the job in the same step, so two of them can never
both act on one job.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from agent.effects import Effect
from agent.jobs.runner import JobRunner, JobView
from agent.jobs.table import JobKind, JobRecord
from agent.store import CheckpointMeta, CheckpointStore, StoreError, safe_job_id
from common.clock import Clock
from schemas.envelope import short_text
from schemas.events.v1 import (
    MigrateJob,
    NodeMode,
    OutputValue,
    SetResources,
    StartJob,
    StopJob,
    now_utc,
)

log = logging.getLogger("clusterwarden.agent.actions")

JobAction = MigrateJob | StartJob | StopJob | SetResources
JOB_ACTIONS: frozenset[str] = frozenset({"migrate_job", "start_job", "stop_job", "set_resources"})

# Failure reasons that retrying the same command cannot cure (the executor should not retry
# them). Every other failure reason of a job action is transient.
PERMANENT_REASONS: frozenset[str] = frozenset({
    "job_not_here",  # the job is not owned by this node (and was not exported from it)
    "node_not_active",  # start_job on a draining or offline node
    "checkpoint_missing",  # start_job from a checkpoint the store does not hold
    "insufficient_gpus",  # set_resources asks for more GPUs than the node has
    "invalid_job_id",  # a job id that cannot name a directory ('.', '..')
    "cancelled",  # a cancel command stopped the action
    "not_supported",  # the agent runs no jobs at all
})

# After SIGKILL, how long a process may take to be gone before a stop counts as timed out.
KILL_WAIT_S = 5.0


def gpu_list(indices: tuple[int, ...]) -> str:
    """GPU indices as an output value: '0,1' ('' for none)."""
    return ",".join(str(i) for i in indices)


def place(views: list[JobView], gpus: int, job_id: str) -> tuple[int, ...]:
    """The GPU a new job gets: the one fewest other jobs use (the lowest index on a tie)."""
    if gpus <= 0:
        return ()
    load = [0] * gpus
    for view in views:
        if view.job_id == job_id:
            continue
        for index in view.gpu_indices:
            if 0 <= index < gpus:
                load[index] += 1
    return (min(range(gpus), key=lambda index: (load[index], index)),)


class JobActions:
    """Decides and performs the job actions of one node."""

    def __init__(
        self,
        node_id: str,
        gpus: int,
        jobs: JobRunner,
        store: CheckpointStore,
        *,
        stop_timeout_s: float = 5.0,
        poll_s: float = 0.05,
        clock: Clock = now_utc,
    ) -> None:
        self.node_id = node_id
        self.gpus = gpus
        self.jobs = jobs
        self.store = store
        self.stop_timeout_s = stop_timeout_s
        self.poll_s = poll_s
        self.clock = clock

    def decide(self, action: JobAction, mode: NodeMode) -> Effect:
        """What `action` would do now, with its side effects still to perform."""
        names = [action.job_id]
        if isinstance(action, StartJob) and action.checkpoint is not None:
            names.append(action.checkpoint)
        if not all(safe_job_id(name) for name in names):
            return Effect("failed", "invalid_job_id", outputs={"job_id": action.job_id})
        if isinstance(action, MigrateJob):
            return self._decide_migrate(action)
        if isinstance(action, StartJob):
            return self._decide_start(action, mode)
        if isinstance(action, StopJob):
            return self._decide_stop(action)
        return self._decide_resources(action)

    # ------------------------------------------------------------ helpers

    async def _wait_settled(self, job_id: str, timeout_s: float) -> bool:
        """Wait (without blocking the loop) until the held job's process is gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.jobs.settled(job_id):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
        return True

    async def _stop(self, job_id: str, timeout_s: float, grace_s: float) -> bool:
        """Hold the job, ask it to checkpoint and stop; True once it has (a cancel lets go)."""
        self.jobs.hold(job_id, grace_s)
        try:
            return await self._wait_settled(job_id, timeout_s)
        except asyncio.CancelledError:
            # Cancelled: the job keeps (or resumes) running here.
            self.jobs.release(job_id)
            raise

    @staticmethod
    def _moved(meta: CheckpointMeta, changed: bool) -> dict[str, OutputValue]:
        outputs: dict[str, OutputValue] = {
            "job_id": meta.job_id,
            "checkpoint": meta.job_id,
            "kind": meta.kind,
            "step": meta.step,
            "progress_pct": round(meta.progress_pct, 3),
            "has_checkpoint": meta.has_checkpoint,
            "changed": changed,
        }
        if meta.to_node is not None:
            outputs["to_node_id"] = meta.to_node
        return outputs

    # ------------------------------------------------------------ migrate_job

    def _decide_migrate(self, action: MigrateJob) -> Effect:
        job_id = action.job_id
        view = self.jobs.view(job_id)
        if view is None:
            meta = self.store.read(job_id)
            if meta is not None and meta.from_node == self.node_id:
                # Exported from here already (the answer was lost, or this is a retry): the
                # job is out, and its checkpoint is where the next node will look.
                return Effect("succeeded", outputs=self._moved(meta, changed=False))
            return Effect("failed", "job_not_here", outputs={"job_id": job_id})
        if view.busy:
            return Effect("failed", "job_busy", outputs={"job_id": job_id})
        outputs: dict[str, OutputValue] = {
            "job_id": job_id, "checkpoint": job_id, "kind": view.kind, "step": view.step,
            "progress_pct": round(view.progress_pct, 3), "changed": True,
        }
        if action.to_node_id is not None:
            outputs["to_node_id"] = action.to_node_id
        plan = (f"checkpoint and stop {job_id} (wait up to {action.checkpoint_timeout_s:g} s),"
                f" export it to the checkpoint store, give it up here")
        return Effect("succeeded", outputs=outputs, run=partial(self._migrate, action),
                      plan=short_text(plan))

    async def _migrate(self, action: MigrateJob) -> Effect:
        job_id, timeout_s = action.job_id, action.checkpoint_timeout_s
        again = self._decide_migrate(action)
        if again.run is None:
            return again  # moved, exported or taken since the command was accepted
        if not await self._stop(job_id, timeout_s, timeout_s + self.stop_timeout_s):
            # It may still be checkpointing: once it exits it comes back here, from its
            # checkpoint (and it is killed if it ignores the stop much longer).
            self.jobs.release(job_id)
            log.warning("job %s did not checkpoint within %g s; it stays here", job_id, timeout_s)
            return Effect("failed", "checkpoint_timeout",
                          outputs={"job_id": job_id, "checkpoint_timeout_s": timeout_s})
        # From here on nothing awaits: a cancel cannot fall between the export and the
        # moment the job is given up.
        view = self.jobs.view(job_id)
        kind: JobKind = view.kind if view is not None else "training"
        try:
            local = self.jobs.local_checkpoint(job_id)
            meta = self.store.export(
                job_id, kind, local.path, step=local.step, progress_pct=local.progress_pct,
                from_node=self.node_id, to_node=action.to_node_id, now=self.clock(),
            )
            self.jobs.forget(job_id)
        except (OSError, StoreError) as err:
            self.jobs.release(job_id)
            log.error("exporting job %s failed: %s", job_id, err)
            return Effect("failed", "export_failed",
                          outputs={"job_id": job_id, "error": short_text(str(err))})
        return Effect("succeeded", outputs=self._moved(meta, changed=True))

    # ------------------------------------------------------------ start_job

    def _decide_start(self, action: StartJob, mode: NodeMode) -> Effect:
        job_id = action.job_id
        if mode != "active":
            return Effect("failed", "node_not_active", outputs={"job_id": job_id, "mode": mode})
        views = self.jobs.views()
        view = next((v for v in views if v.job_id == job_id), None)
        if view is not None and view.busy:
            return Effect("failed", "job_busy", outputs={"job_id": job_id})
        if view is not None and view.state != "failed":
            # Started already (a retry, or the job never left): nothing to do. A job that
            # failed here is started again.
            return Effect("succeeded", outputs={
                "job_id": job_id, "kind": view.kind, "state": view.state, "started": False,
                "step": view.step, "progress_pct": round(view.progress_pct, 3),
                "gpu_indices": gpu_list(view.gpu_indices), "changed": False,
            })
        meta: CheckpointMeta | None = None
        if action.checkpoint is not None:
            meta = self.store.read(action.checkpoint)
            if meta is None:
                return Effect("failed", "checkpoint_missing",
                              outputs={"job_id": job_id, "checkpoint": action.checkpoint})
            if meta.kind != action.kind:
                log.warning("start_job %s as %s from a %s checkpoint", job_id, action.kind,
                            meta.kind)
        gpus = place(views, self.gpus, job_id)
        outputs: dict[str, OutputValue] = {
            "job_id": job_id, "kind": action.kind, "started": True,
            "resumed_step": meta.step if meta is not None else 0,
            "progress_pct": round(meta.progress_pct, 3) if meta is not None else 0.0,
            "gpu_indices": gpu_list(gpus), "changed": True,
        }
        if meta is not None:
            outputs["checkpoint"] = meta.job_id
            outputs["resumed_from_node"] = meta.from_node
        source = (f"from checkpoint {action.checkpoint} (step {outputs['resumed_step']})"
                  if meta is not None else "fresh")
        plan = f"start {action.kind} job {job_id} {source} on GPU(s) [{gpu_list(gpus)}]"
        record = JobRecord(job_id, action.kind, gpus)
        return Effect("succeeded", outputs=outputs,
                      apply=partial(self._start, record, meta, outputs), plan=short_text(plan))

    def _start(
        self, record: JobRecord, meta: CheckpointMeta | None, outputs: dict[str, OutputValue]
    ) -> Effect:
        target = self.jobs.checkpoint_file(record.job_id)
        try:
            if target is not None:
                if meta is not None and meta.has_checkpoint:
                    self.store.fetch(meta, target)
                else:
                    # A fresh start must not resume from what an earlier run left here.
                    target.unlink(missing_ok=True)
            self.jobs.add(record, step=meta.step if meta is not None else 0,
                          progress_pct=meta.progress_pct if meta is not None else 0.0)
        except StoreError as err:
            log.error("starting job %s failed: %s", record.job_id, err)
            return Effect("failed", err.reason,
                          outputs={"job_id": record.job_id, "error": short_text(err.detail)})
        except OSError as err:
            log.error("starting job %s failed: %s", record.job_id, err)
            return Effect("failed", "io_error",
                          outputs={"job_id": record.job_id, "error": short_text(str(err))})
        return Effect("succeeded", outputs=outputs)

    # ------------------------------------------------------------ stop_job

    def _decide_stop(self, action: StopJob) -> Effect:
        job_id = action.job_id
        view = self.jobs.view(job_id)
        if view is None:
            return Effect("succeeded",
                          outputs={"job_id": job_id, "stopped": False, "changed": False})
        if view.busy:
            return Effect("failed", "job_busy", outputs={"job_id": job_id})
        outputs: dict[str, OutputValue] = {
            "job_id": job_id, "kind": view.kind, "stopped": True, "step": view.step,
            "progress_pct": round(view.progress_pct, 3), "changed": True,
        }
        plan = f"checkpoint and stop {job_id}, give it up here (its checkpoint stays local)"
        return Effect("succeeded", outputs=outputs, run=partial(self._stop_job, action),
                      plan=short_text(plan))

    async def _stop_job(self, action: StopJob) -> Effect:
        job_id = action.job_id
        again = self._decide_stop(action)
        if again.run is None:
            return again  # stopped or taken since the command was accepted
        planned = again.outputs
        grace = self.stop_timeout_s
        if not await self._stop(job_id, grace + KILL_WAIT_S, grace):
            self.jobs.release(job_id)
            return Effect("failed", "stop_timeout", outputs={"job_id": job_id})
        try:
            local = self.jobs.local_checkpoint(job_id)
            self.jobs.forget(job_id)
        except OSError as err:
            self.jobs.release(job_id)
            return Effect("failed", "io_error",
                          outputs={"job_id": job_id, "error": short_text(str(err))})
        return Effect("succeeded", outputs=planned | {
            "step": local.step, "progress_pct": round(local.progress_pct, 3),
            "has_checkpoint": local.path is not None,
        })

    # ------------------------------------------------------------ set_resources

    def _decide_resources(self, action: SetResources) -> Effect:
        job_id = action.job_id
        view = self.jobs.view(job_id)
        if view is None:
            return Effect("failed", "job_not_here", outputs={"job_id": job_id})
        if action.gpus > self.gpus:
            return Effect("failed", "insufficient_gpus", outputs={
                "job_id": job_id, "gpus": action.gpus, "node_gpus": self.gpus,
            })
        gpus = tuple(range(action.gpus))
        gpus_changed = gpus != view.gpu_indices
        changed = gpus_changed or action.memory_mib != view.memory_mib
        # A training process holds its GPUs for its lifetime: new GPUs mean a restart, from
        # the checkpoint it writes as it stops.
        restart = gpus_changed and view.kind == "training" and view.alive
        outputs: dict[str, OutputValue] = {
            "job_id": job_id, "kind": view.kind, "gpus": action.gpus,
            "gpu_indices": gpu_list(gpus), "memory_mib": action.memory_mib,
            "previous_gpu_indices": gpu_list(view.gpu_indices),
            "previous_memory_mib": view.memory_mib, "restarted": restart, "changed": changed,
        }
        if not changed:
            return Effect("succeeded", outputs=outputs)
        if view.busy:
            return Effect("failed", "job_busy", outputs={"job_id": job_id})
        plan = (f"give {job_id} GPU(s) [{gpu_list(gpus)}] and {action.memory_mib} MiB"
                + (", restarting it from its checkpoint" if restart else ""))
        if restart:
            return Effect("succeeded", outputs=outputs, run=partial(self._restart, action),
                          plan=short_text(plan))
        return Effect("succeeded", outputs=outputs,
                      apply=partial(self._resize, action, gpus, outputs), plan=short_text(plan))

    def _resize(
        self, action: SetResources, gpus: tuple[int, ...], outputs: dict[str, OutputValue]
    ) -> Effect:
        try:
            self.jobs.resize(action.job_id, gpus, action.memory_mib)
        except OSError as err:
            return Effect("failed", "io_error",
                          outputs={"job_id": action.job_id, "error": short_text(str(err))})
        return Effect("succeeded", outputs=outputs)

    async def _restart(self, action: SetResources) -> Effect:
        again = self._decide_resources(action)
        if again.run is None:
            # The job stopped, moved or was taken since: recorded at most, no restart.
            return again if again.apply is None else again.apply()
        resized = self._resize(action, tuple(range(action.gpus)), again.outputs)
        if resized.outcome != "succeeded":
            return resized
        grace = self.stop_timeout_s
        stopped = await self._stop(action.job_id, grace + KILL_WAIT_S, grace)
        # Stopped or not, the job runs again: on its new GPUs once its process is gone.
        self.jobs.release(action.job_id)
        if not stopped:
            return Effect("failed", "stop_timeout", outputs={"job_id": action.job_id})
        return resized
