"""GPU fault classification: what each fault calls for, from a published XID playbook."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from schemas.events.v1 import ActionClass, Fault, FaultKind, GpuMetrics

# How far each class takes a node, so several faults resolve to the strongest one.
SEVERITY: Final[Mapping[ActionClass, int]] = MappingProxyType(
    {"none": 0, "reset": 1, "drain": 2, "reboot": 3, "replace": 4}
)
# Classes that mean the GPU itself failed; only these count towards repeated-fault escalation.
FATAL: Final[frozenset[ActionClass]] = frozenset({"reset", "reboot", "replace"})
GPU_FAULT_KINDS: Final[frozenset[FaultKind]] = frozenset({"xid", "ecc"})

# The EKS node monitoring agent's published XID table (Amazon EKS User Guide, "Detect node
# health issues with the EKS node monitoring agent", AcceleratedHardware issues,
# https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html): these XIDs are
# "Conditions" that call for a repair; every other XID is an "Event", recorded and never
# repaired.
PUBLISHED_XID_ACTIONS: Final[Mapping[int, ActionClass]] = MappingProxyType(
    {
        13: "reboot", 31: "reboot", 48: "reboot", 63: "reboot", 64: "reboot",
        94: "reboot", 95: "reboot",
        74: "replace", 79: "replace", 119: "replace", 120: "replace", 121: "replace",
        140: "replace",
    }
)
# XID 13 (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing)
# and 45 (preemptive cleanup), as NVIDIA's XID documentation names them
# (https://docs.nvidia.com/deploy/xid-errors/), are usually raised by the job's own bug.
# NVSentinel's analyzer (NVIDIA/NVSentinel, docs/configuration/health-events-analyzer.md)
# calls them software faults (no action) unless they repeat on one unit; rebooting for them
# would let one buggy job take node after node offline. The EKS table reboots for 13 and 31:
# an operator who wants that sets `xid_overrides`.
APPLICATION_XIDS: Final[frozenset[int]] = frozenset({13, 31, 43, 45})
XID_ACTIONS: Final[Mapping[int, ActionClass]] = MappingProxyType(
    {
        **PUBLISHED_XID_ACTIONS,
        **dict.fromkeys(APPLICATION_XIDS, "none"),
    }
)
# Heartbeat loss, a failed centre probe, a dead agent or a hung job: the node cannot be
# trusted with work, but nothing says the hardware must be reset or replaced.
NODE_FAULT_ACTION: Final[ActionClass] = "drain"

XidCode = Annotated[int, Field(ge=0, le=65_535)]


class FaultArgs(BaseModel):
    """How faults are classified: XID overrides, the corrected-ECC limit, repeat escalation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    xid_overrides: dict[XidCode, ActionClass] = Field(
        default_factory=dict, description="Per-XID classes that replace the built-in table."
    )
    ecc_corrected_max: int | None = Field(
        default=None, ge=0, le=2**53,
        description=(
            "Corrected volatile ECC errors on one GPU above this make the node drain-worthy; "
            "None (the default) ignores corrected errors, which no published playbook acts on."
        ),
    )
    repeat_threshold: int = Field(
        default=5, ge=1, le=1_000,
        description="Fatal faults on one GPU within the window that escalate it to replace.",
    )
    repeat_window_s: float = Field(
        default=86_400.0, gt=0.0, le=30 * 86_400.0,
        description="The window fatal faults are counted in (NVSentinel: 5 in 24 h).",
    )


class ClassifiedFault(BaseModel):
    """One fault and the class of action it calls for."""

    model_config = ConfigDict(frozen=True)

    fault: Fault
    action_class: ActionClass


class FaultVerdict(BaseModel):
    """What a node's fault data calls for, with the faults that count and those only recorded."""

    model_config = ConfigDict(frozen=True)

    action_class: ActionClass
    counted: tuple[ClassifiedFault, ...] = ()
    ignored: tuple[Fault, ...] = ()
    escalated_gpus: tuple[int, ...] = ()
    detail: str = ""

    @property
    def gpu_only(self) -> bool:
        """True when every fault that counts is a GPU fault (the need is at GPU level)."""
        return bool(self.counted) and all(c.fault.kind in GPU_FAULT_KINDS for c in self.counted)

    @property
    def fatal_by_gpu(self) -> dict[int, int]:
        """Fatal faults per GPU index in this observation: what a fault history should record."""
        return _fatal_by_gpu(self.counted)


def _fatal_by_gpu(counted: Iterable[ClassifiedFault]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for c in counted:
        if c.action_class in FATAL and c.fault.gpu_index is not None:
            counts[c.fault.gpu_index] = counts.get(c.fault.gpu_index, 0) + 1
    return counts


def strongest(classes: Iterable[ActionClass]) -> ActionClass:
    """The most severe class among `classes` ("none" if there are none)."""
    return max(classes, key=SEVERITY.__getitem__, default="none")


def xid_action(code: int | None, args: FaultArgs) -> ActionClass:
    """The class an XID calls for; an unknown XID is an event to record, not to act on."""
    if code is None:
        return "none"
    if code in args.xid_overrides:
        return args.xid_overrides[code]
    return XID_ACTIONS.get(code, "none")


def fault_action(fault: Fault, args: FaultArgs) -> ActionClass:
    """The class one reported fault calls for."""
    if fault.kind == "xid":
        return xid_action(fault.code, args)
    if fault.kind == "ecc":
        # The agent reports an ECC fault only for uncorrected errors (corrected ones arrive as
        # counters); an uncorrected error may have corrupted memory in use: reboot at least.
        return "reboot"
    return NODE_FAULT_ACTION


def escalate(action: ActionClass, fatal_count: int, threshold: int) -> ActionClass:
    """`replace` once a GPU had `threshold` fatal faults in the window; else `action`."""
    if action in FATAL and fatal_count >= threshold:
        return "replace"
    return action


def count_within(times: Iterable[datetime], now: datetime, window_s: float) -> int:
    """How many of `times` fall within the `window_s` seconds up to `now`."""
    return sum(1 for t in times if 0.0 <= (now - t).total_seconds() <= window_s)


def _gpu_metric_faults(
    faults: Sequence[Fault], gpus: Sequence[GpuMetrics], args: FaultArgs
) -> list[ClassifiedFault]:
    """Faults visible in the GPU metrics that the report's fault list does not already name."""
    # The agent copies XIDs and uncorrected ECC into its fault list; count each once.
    reported_xids = {(f.code, f.gpu_index) for f in faults if f.kind == "xid"}
    reported_ecc = {f.gpu_index for f in faults if f.kind == "ecc"}
    found: list[ClassifiedFault] = []
    for gpu in gpus:
        for code in dict.fromkeys(gpu.xid_events):
            if (code, gpu.index) not in reported_xids:
                xid = Fault(kind="xid", code=code, gpu_index=gpu.index, detail="gpu metrics")
                found.append(ClassifiedFault(fault=xid, action_class=xid_action(code, args)))
        uncorrected = gpu.ecc_uncorrected_volatile or 0
        if uncorrected > 0 and gpu.index not in reported_ecc:
            ecc = Fault(kind="ecc", gpu_index=gpu.index,
                        detail=f"{uncorrected} uncorrected ECC errors (volatile)")
            found.append(ClassifiedFault(fault=ecc, action_class="reboot"))
        corrected = gpu.ecc_corrected_volatile or 0
        if args.ecc_corrected_max is not None and corrected > args.ecc_corrected_max:
            ecc = Fault(kind="ecc", gpu_index=gpu.index,
                        detail=f"{corrected} corrected ECC errors (volatile) "
                               f"> {args.ecc_corrected_max}")
            found.append(ClassifiedFault(fault=ecc, action_class="drain"))
    return found


def describe(fault: Fault) -> str:
    """A short name for a fault, as evidence shows it."""
    where = f" on gpu {fault.gpu_index}" if fault.gpu_index is not None else ""
    if fault.kind == "xid":
        return f"xid {fault.code}{where}"
    if fault.kind == "ecc":
        return f"ecc{where} [{fault.detail or 'uncorrected'}]"
    return f"{fault.kind}{where}" + (f" [{fault.detail}]" if fault.detail else "")


def classify(
    faults: Sequence[Fault],
    gpus: Sequence[GpuMetrics],
    args: FaultArgs,
    recent_fatal: Mapping[int, int] | None = None,
) -> FaultVerdict:
    """Classify a node's faults; `recent_fatal`: earlier fatal faults per GPU in the window."""
    classified = [ClassifiedFault(fault=f, action_class=fault_action(f, args)) for f in faults]
    classified += _gpu_metric_faults(faults, gpus, args)
    counted = [c for c in classified if c.action_class != "none"]
    ignored = tuple(c.fault for c in classified if c.action_class == "none")

    # A GPU that keeps failing is escalated as a whole: every fatal fault on it now says replace.
    earlier = recent_fatal or {}
    totals = {gpu: earlier.get(gpu, 0) + n for gpu, n in _fatal_by_gpu(counted).items()}
    escalated = sorted(gpu for gpu, total in totals.items() if total >= args.repeat_threshold)
    parts: list[str] = []
    final: list[ClassifiedFault] = []
    for c in counted:
        gpu = c.fault.gpu_index
        action = escalate(c.action_class, totals.get(gpu, 0) if gpu is not None else 0,
                          args.repeat_threshold)
        final.append(ClassifiedFault(fault=c.fault, action_class=action))
        change = f"{c.action_class}->{action}" if action != c.action_class else action
        parts.append(f"{describe(c.fault)}: {change}")
    for gpu in escalated:
        parts.append(f"gpu {gpu}: {totals[gpu]} fatal faults within {args.repeat_window_s:.0f}s "
                     f"(limit {args.repeat_threshold})")
    if ignored:
        parts.append("recorded only: " + ", ".join(describe(f) for f in ignored))
    return FaultVerdict(
        action_class=strongest(c.action_class for c in final),
        counted=tuple(final),
        ignored=ignored,
        escalated_gpus=tuple(escalated),
        detail="; ".join(parts),
    )
