"""Pure task lifecycle policy: operator controls, and which failures are worth a retry.

Final states are succeeded, failed and terminated; only a failed task can be retried, and a
failed or terminated one restarted (from its first step, under a new epoch). A
task the executor has not seen yet (still queued at the scheduler) is in state `queued`:
a pause or a terminate for it is kept and applied when it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.events.v1 import StepState, TaskState

ControlAction = Literal["pause", "resume", "retry", "terminate", "jump", "restart"]
Cause = Literal["rejected", "failed", "timeout", "children_failed", "terminated"]

FINAL_STATES: frozenset[TaskState] = frozenset({"succeeded", "failed", "terminated"})

# Agent failure reasons a retry cannot help: the node is in the wrong state for the action,
# the job is elsewhere, or the command itself is wrong. Every `rejected` outcome is
# permanent too (expired, stale epoch, wrong audience...: sending it again cannot help).
# Extend this set, in one place, when an agent action gains a new permanent reason.
PERMANENT_REASONS: frozenset[str] = frozenset({
    "not_drained",
    "job_not_here",
    "node_not_active",
    "invalid_payload",
    "not_supported",
    "not_supported_yet",
    # The agent's job actions (agent/actions.py): the job or its checkpoint is not where the
    # plan said, the node cannot host it, or an operator cancelled the command.
    "checkpoint_missing",
    "insufficient_gpus",
    "invalid_job_id",
    "cancelled",
})


@dataclass(frozen=True)
class Decision:
    """What a control does to a task: allowed or not, the state it leads to, and why."""

    allowed: bool
    new_state: TaskState
    reason: str
    # A pause of a task whose step is running takes effect when that step ends.
    at_boundary: bool = False
    # A resume of a pause that has not taken effect yet only withdraws it.
    withdraw_pause: bool = False


def _refuse(state: TaskState, why: str) -> Decision:
    return Decision(False, state, why)


def decide_control(
    state: TaskState,
    step_state: StepState | None,
    action: ControlAction,
    step_index: int | None,
    n_steps: int,
    *,
    pause_requested: bool = False,
    seen: bool = True,
) -> Decision:
    """What operator `action` does to a task in `state` whose current step is `step_state`.

    `seen` is False for a task the executor has not received yet (its `n_steps` is unknown);
    `pause_requested` means a pause is waiting for the running step to end.
    """
    if action == "pause":
        if state == "running":
            if pause_requested:
                return _refuse(state, "a pause is already requested")
            if step_state == "started":
                return Decision(True, "paused", "pauses when the running step ends",
                                at_boundary=True)
            return Decision(True, "paused", "paused before its next step")
        if state == "queued":
            return Decision(True, "paused", "paused: applies when the task reaches the executor")
        if state == "paused":
            return _refuse(state, "already paused")
        return _refuse(state, f"the task is {state}")

    if action == "resume":
        if state == "paused":
            if not seen:
                return Decision(True, "queued", "the pending pause is withdrawn")
            return Decision(True, "running", "resumed")
        if state == "running" and pause_requested:
            return Decision(True, "running", "the requested pause is withdrawn",
                            withdraw_pause=True)
        return _refuse(state, f"the task is {state}, not paused")

    if action == "retry":
        if not seen:
            return _refuse(state, "the task has not reached the executor")
        if state == "failed":
            return Decision(True, "running", "the failed step runs again from its first attempt")
        return _refuse(state, f"only a failed task can be retried; it is {state}")

    if action == "restart":
        if not seen:
            return _refuse(state, "the task has not reached the executor")
        if state in ("failed", "terminated"):
            return Decision(True, "running", "runs again from its first step under a new epoch")
        return _refuse(state, f"only a failed or terminated task can be restarted; it is {state}")

    if action == "terminate":
        if state in ("running", "paused", "queued"):
            return Decision(True, "terminated", "terminated")
        return _refuse(state, f"the task is already {state}")

    # jump
    if not seen:
        return _refuse(state, "the task has not reached the executor")
    if step_index is None or not 0 <= step_index < n_steps:
        return _refuse(state, f"step {step_index} is out of range 0..{n_steps - 1}")
    if state == "running":
        return _refuse(state, "the task is running: pause first")
    if state in ("paused", "failed"):
        return Decision(True, "paused", f"paused at step {step_index}; resume to run it")
    return _refuse(state, f"the task is {state}")


# ---------------------------------------------------------------- failures and retries


def is_permanent(outcome: str, reason: str) -> bool:
    """Whether a failed attempt is not worth retrying (a rejection or a permanent reason)."""
    return outcome == "rejected" or (outcome == "failed" and reason in PERMANENT_REASONS)


def failure_cause(outcome: str) -> Cause:
    """The cause a failed task reports, so the scheduler's breaker can tell them apart."""
    if outcome == "rejected":
        return "rejected"
    if outcome == "unknown":
        return "timeout"
    return "failed"


def backoff_s(failed_attempt: int, base_s: float, max_s: float) -> float:
    """Delay before the next attempt after attempt `failed_attempt` (0-based) failed."""
    # Capped before exponentiating too far: 2**64 seconds is not a useful delay.
    return min(max_s, base_s * 2.0 ** min(failed_attempt, 32))
