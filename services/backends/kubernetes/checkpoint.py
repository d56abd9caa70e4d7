"""The checkpoint protocol before an eviction: what a drain writes on a pod, and how it reads
the workload's answer (pure; docs/kubernetes.md has it for workload authors).

A pod opts in with the annotation `clusterwarden.io/checkpoint-timeout-s: "<seconds>"`. Before
evicting it, the drain writes `clusterwarden.io/checkpoint-request`
`{"id": "<task id>/<step>", "task_id", "step", "requested_at"}` on it; the workload saves a
checkpoint and answers on the same pod with `clusterwarden.io/checkpoint`
`{"request": <that id>, "step": <training step saved>, "path": ...}`. The drain waits for that
answer up to the pod's timeout (counted from `requested_at`, so a resend after a crash does
not start it again), then evicts. A pod that does not opt in is not asked: it gets SIGTERM and
its termination grace period, as every evicted pod does. The replacement may report the step
it resumed from in `clusterwarden.io/resumed-from`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.kubernetes import (
    CHECKPOINT_ANNOTATION,
    CHECKPOINT_REQUEST_ANNOTATION,
    CHECKPOINT_TIMEOUT_ANNOTATION,
    RESUMED_FROM_ANNOTATION,
)
from services.backends.base import StepRef

# No drain waits longer for one pod's checkpoint, whatever its annotation says.
MAX_CHECKPOINT_TIMEOUT_S = 3_600.0


@dataclass(frozen=True)
class CheckpointRequest:
    """A drain's request on one pod."""

    id: str
    task_id: str
    step: str
    requested_at: float
    """Epoch seconds."""

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "task_id": self.task_id, "step": self.step,
                           "requested_at": self.requested_at}, sort_keys=True)


@dataclass(frozen=True)
class CheckpointAck:
    """The workload's answer to a request: the training step it saved, and where."""

    request: str
    step: int
    path: str | None = None


@dataclass(frozen=True)
class CheckpointPlan:
    """What a drain does about one opted-in pod before evicting it."""

    request: CheckpointRequest
    ask: bool
    """Write the request (False: the pod already carries this step's own request)."""
    deadline: float
    """Epoch seconds after which the drain stops waiting for the answer."""


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def request_id(step: StepRef) -> str:
    return f"{step.task_id}/{step.step}"


def _json(raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def opt_in_timeout(annotations: Mapping[str, str]) -> float | None:
    """The pod's checkpoint timeout in seconds (capped); None: it does not opt in (absent,
    not a positive number)."""
    try:
        timeout = float(annotations.get(CHECKPOINT_TIMEOUT_ANNOTATION, ""))
    except ValueError:
        return None
    if not math.isfinite(timeout) or timeout <= 0:
        return None
    return min(timeout, MAX_CHECKPOINT_TIMEOUT_S)


def request_of(annotations: Mapping[str, str]) -> CheckpointRequest | None:
    """The request on the pod, or None (an unreadable one is none)."""
    data = _json(annotations.get(CHECKPOINT_REQUEST_ANNOTATION))
    if data is None:
        return None
    try:
        return CheckpointRequest(id=str(data["id"]), task_id=str(data["task_id"]),
                                 step=str(data["step"]),
                                 requested_at=float(data["requested_at"]))
    except (KeyError, TypeError, ValueError):
        return None


def ack_of(annotations: Mapping[str, str], request: str) -> CheckpointAck | None:
    """The workload's answer to `request`; None: no answer yet, one to another request, or
    one that does not say a step."""
    data = _json(annotations.get(CHECKPOINT_ANNOTATION))
    if data is None or str(data.get("request")) != request:
        return None
    step = data.get("step")
    if isinstance(step, bool) or not isinstance(step, int | str):
        return None
    try:
        saved = int(step)
    except ValueError:
        return None
    path = data.get("path")
    return CheckpointAck(request=request, step=saved,
                         path=str(path) if path is not None else None)


def resumed_from(annotations: Mapping[str, str]) -> int | None:
    """The step a replacement pod says it resumed from; None: it says none (or nonsense)."""
    try:
        return int(annotations.get(RESUMED_FROM_ANNOTATION, ""))
    except ValueError:
        return None


def plan_checkpoint(annotations: Mapping[str, str], step: StepRef,
                    now: float) -> CheckpointPlan | None:
    """None for a pod that does not opt in. A pod already carrying this step's own request
    (a resend after a crash, a retry) is not asked again, and its wait counts from then."""
    timeout = opt_in_timeout(annotations)
    if timeout is None:
        return None
    existing = request_of(annotations)
    if existing is not None and existing.id == request_id(step):
        return CheckpointPlan(existing, ask=False, deadline=existing.requested_at + timeout)
    request = CheckpointRequest(id=request_id(step), task_id=step.task_id, step=step.step,
                                requested_at=now)
    return CheckpointPlan(request, ask=True, deadline=now + timeout)


def request_patch(request: CheckpointRequest, resource_version: str) -> dict[str, Any]:
    """The JSON merge patch that asks: the request annotation alone, guarded by the
    resourceVersion the plan was made on."""
    return {"metadata": {"resourceVersion": resource_version,
                         "annotations": {CHECKPOINT_REQUEST_ANNOTATION: request.to_json()}}}
