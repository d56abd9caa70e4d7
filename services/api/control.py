"""Whether an operator's control is legal for a task as the store records it (pure).

The executor decides again when the control arrives (`services.executor.control`, the same
function): the store may be a moment behind it, so a control the API accepts can still be
refused there, which the task's history then shows as a `refused ...` transition. Checking
here first answers the obvious cases (resume a running task, retry a succeeded one) at once
with 409 instead of an event nobody waits for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from schemas.events.v1 import StepState, TaskState
from services.executor.control import ControlAction, Decision, decide_control

# States of a task the executor has not received yet: the scheduler still holds it.
UNSEEN: frozenset[str] = frozenset({"created", "queued", "dispatched"})
_TASK_STATES: frozenset[str] = frozenset(
    {"created", "queued", "dispatched", "running", "paused", "succeeded", "failed",
     "terminated"})
_STEP_STATES: frozenset[str] = frozenset(
    {"scheduled", "started", "completed", "failed", "skipped"})


class TransitionLike(Protocol):
    """What this module reads of a recorded transition."""

    @property
    def state(self) -> str: ...
    @property
    def step_index(self) -> int | None: ...
    @property
    def step_state(self) -> str | None: ...
    @property
    def outputs(self) -> Mapping[str, Any] | None: ...


def _control_of(t: TransitionLike) -> str | None:
    """The operator control a transition records (None for the executor's own steps)."""
    outputs = t.outputs or {}
    if outputs.get("refused"):
        return None
    control = outputs.get("control")
    return control if isinstance(control, str) else None


def pending_unseen(transitions: Sequence[TransitionLike]) -> TaskState:
    """The state the executor keeps for a task it has not received: a control that arrived
    first is held (pause, terminate) or withdrawn (resume), as the executor does."""
    state: TaskState = "queued"
    for t in transitions:
        if not (t.outputs or {}).get("pending"):
            continue
        control = _control_of(t)
        if control == "pause":
            state = "paused"
        elif control == "terminate":
            state = "terminated"
        elif control == "resume":
            state = "queued"
    return state


def pause_requested(transitions: Sequence[TransitionLike]) -> bool:
    """Whether a pause waits for the running step to end: announced as a `running`
    transition of a pause control, and over once the task leaves `running` or is resumed."""
    requested = False
    for t in transitions:
        control = _control_of(t)
        if control == "pause" and t.state == "running":
            requested = True
        elif control == "resume" or t.state != "running":
            requested = False
    return requested


def current_step_state(transitions: Sequence[TransitionLike]) -> tuple[int | None,
                                                                         StepState | None]:
    """The step the task is at and that step's state, from its latest step transition."""
    for t in reversed(transitions):
        if t.step_index is not None and t.step_state in _STEP_STATES:
            return t.step_index, cast(StepState, t.step_state)
    return None, None


def decide(state: str, n_steps: int, transitions: Sequence[TransitionLike],
           action: ControlAction, step_index: int | None) -> Decision:
    """The executor's decision for `action`, made from the recorded history of a task."""
    if state not in _TASK_STATES:
        return Decision(False, "failed", f"the task's recorded state {state!r} is unknown")
    if state in UNSEEN:
        return decide_control(pending_unseen(transitions), None, action, step_index, 0,
                              seen=False)
    _, step_state = current_step_state(transitions)
    return decide_control(cast(TaskState, state), step_state, action, step_index, n_steps,
                          pause_requested=pause_requested(transitions))
