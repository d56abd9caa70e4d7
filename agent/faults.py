"""Fault injection through `<state_dir>/faults.json`, read by the agent on every report."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.envelope import short_text
from schemas.events.v1 import ActionName, Fault, GpuMetrics, HostMetrics, JobInfo

log = logging.getLogger("clusterwarden.agent.faults")

FAULTS_FILE = "faults.json"
MAX_XIDS = 64


class ModelFault(BaseModel):
    """A served model (or every model of the node) that fails some tasks, or answers slowly."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, frozen=True)

    model: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,128}(@[A-Za-z0-9_.-]{1,32})?$")] \
        | None = Field(default=None, description="name or name@version; None: every model.")
    failure_rate: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    cause: Literal["model_fault", "node_fault"] = Field(
        default="model_fault",
        description="model_fault: the output turns to NaN; node_fault: a device error.")
    latency_ms: Annotated[float, Field(ge=0.0, le=600_000.0)] = Field(
        default=0.0, description="Added to every answer of the model(s).")


class FaultPlan(BaseModel):
    """What the agent should pretend is broken; the default is a healthy node."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True, frozen=True)

    xid: list[Annotated[int, Field(ge=0, le=65_535)]] = Field(
        default_factory=list, max_length=MAX_XIDS
    )
    ecc_uncorrected: Annotated[int, Field(ge=0, le=2**53)] = 0
    hung_job: bool = Field(
        default=False, description="Freeze a job (SIGSTOP) until the plan no longer says so."
    )
    silent: bool = Field(default=False, description="Alive, but sends no reports.")
    slow_s: Annotated[float, Field(ge=0.0, le=3_600.0)] = 0.0
    fail_actions: list[ActionName] = Field(default_factory=list, max_length=16)
    gpu_index: Annotated[int, Field(ge=0, le=63)] = Field(
        default=0, description="The GPU the injected XIDs and ECC errors are on."
    )
    load_pct: Annotated[float, Field(ge=0.0, le=100.0)] | None = Field(
        default=None, description="Hold the simulated GPUs' utilisation near this value."
    )
    flap_s: Annotated[float, Field(ge=0.0, le=3_600.0)] = Field(
        default=0.0, description="Alternate reporting and silence every flap_s seconds (0: off)."
    )
    ignore_commands: bool = Field(
        default=False, description="Reports go on, but commands get no answer at all."
    )
    disk_used_pct: Annotated[float, Field(ge=0.0, le=100.0)] | None = Field(
        default=None, description="Report the disk this full instead of what psutil reads.")
    memory_used_pct: Annotated[float, Field(ge=0.0, le=100.0)] | None = Field(
        default=None, description="Report host memory this full instead of what psutil reads.")
    partitioned: bool = Field(
        default=False, description="Reports go on, but the node is cut off from its peers: "
        "its probe listener drops their probes and its own probes of them fail.")
    model_faults: list[ModelFault] = Field(
        default_factory=list, max_length=16,
        description="Served models that fail or slow down (the first that applies counts).")

    @property
    def healthy(self) -> bool:
        return self == FaultPlan()


def reports_paused(plan: FaultPlan, now: datetime) -> bool:
    """True if the plan keeps the node from reporting at `now` (silent, or a flap's off phase)."""
    if plan.silent:
        return True
    if plan.flap_s <= 0.0:
        return False
    # Phases follow the wall clock, so every agent and every test sees the same schedule
    # without the plan having to remember when it was written.
    return math.floor(now.timestamp() / plan.flap_s) % 2 == 1


def faults_path(state_dir: Path) -> Path:
    """The fault plan file of an agent."""
    return state_dir / FAULTS_FILE


def write_faults(state_dir: Path, plan: FaultPlan) -> Path:
    """Write the plan atomically, so the agent never reads half a file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = faults_path(state_dir)
    tmp = path.with_name(f".{FAULTS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_faults(state_dir: Path) -> FaultPlan:
    """The current plan; a missing or unreadable file means no faults."""
    path = faults_path(state_dir)
    try:
        return FaultPlan.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return FaultPlan()
    except (OSError, ValidationError) as err:
        log.warning("ignoring the fault plan %s: %s", path, err)
        return FaultPlan()


def clear_fault_file(state_dir: Path) -> None:
    """Remove the plan: the node is healthy again."""
    faults_path(state_dir).unlink(missing_ok=True)


def faults_for_report(plan: FaultPlan) -> list[Fault]:
    """The XID and ECC faults an injected plan adds (a hung job is seen in the jobs instead)."""
    faults = [
        Fault(kind="xid", code=xid, gpu_index=plan.gpu_index, detail="injected")
        for xid in plan.xid
    ]
    if plan.ecc_uncorrected:
        faults.append(
            Fault(
                kind="ecc",
                gpu_index=plan.gpu_index,
                detail=f"injected: {plan.ecc_uncorrected} uncorrected ECC errors",
            )
        )
    return faults


def job_faults(jobs: Sequence[JobInfo], plan: FaultPlan) -> list[Fault]:
    """A hung_job fault per hung job; the plan's word alone only where no job runs to hang."""
    faults = [
        Fault(kind="hung_job", detail=short_text(f"{job.job_id}: no progress"))
        for job in jobs
        if job.state == "hung"
    ]
    if plan.hung_job and not jobs:
        faults.append(Fault(kind="hung_job", detail="injected: no job runs here to hang"))
    return faults


def gpu_faults(gpus: list[GpuMetrics]) -> list[Fault]:
    """The fault data the GPUs themselves show: XID events and uncorrected ECC errors."""
    faults: list[Fault] = []
    for gpu in gpus:
        faults.extend(
            Fault(kind="xid", code=xid, gpu_index=gpu.index, detail="nvml event")
            for xid in gpu.xid_events
        )
        if gpu.ecc_uncorrected_volatile:
            faults.append(
                Fault(
                    kind="ecc",
                    gpu_index=gpu.index,
                    detail=f"{gpu.ecc_uncorrected_volatile} uncorrected ECC errors (volatile)",
                )
            )
    return faults


def inject_into_host(plan: FaultPlan, host: HostMetrics) -> HostMetrics:
    """The host as it would look with the plan's full disk or memory pressure."""
    changes: dict[str, object] = {}
    if plan.disk_used_pct is not None:
        changes["disk_used_pct"] = plan.disk_used_pct
    if plan.memory_used_pct is not None and host.memory_total_mib:
        changes["memory_used_mib"] = int(host.memory_total_mib * plan.memory_used_pct / 100.0)
    return HostMetrics.model_validate(host.model_dump() | changes) if changes else host


def inject_into_gpus(plan: FaultPlan, gpus: list[GpuMetrics]) -> list[GpuMetrics]:
    """The GPUs as they would look with the plan's XIDs and ECC errors on `plan.gpu_index`."""
    if not plan.xid and not plan.ecc_uncorrected:
        return gpus
    injected: list[GpuMetrics] = []
    for gpu in gpus:
        if gpu.index != plan.gpu_index:
            injected.append(gpu)
            continue
        ecc = (gpu.ecc_uncorrected_volatile or 0) + plan.ecc_uncorrected
        aggregate = (gpu.ecc_uncorrected_aggregate or 0) + plan.ecc_uncorrected
        # Validated again rather than model_copy(update=...), so bounds still hold.
        injected.append(
            GpuMetrics.model_validate(
                gpu.model_dump()
                | {
                    "xid_events": [*gpu.xid_events, *plan.xid][:MAX_XIDS],
                    "ecc_uncorrected_volatile": min(ecc, 2**53),
                    "ecc_uncorrected_aggregate": min(aggregate, 2**53),
                }
            )
        )
    return injected
