"""Table tests of the task lifecycle policy: operator controls, permanence and backoff."""

from __future__ import annotations

import pytest

from schemas.events.v1 import StepState, TaskState
from services.executor.control import (
    PERMANENT_REASONS,
    ControlAction,
    backoff_s,
    decide_control,
    failure_cause,
    is_permanent,
)


@pytest.mark.parametrize(
    ("state", "step_state", "action", "allowed", "new_state", "reason"),
    [
        ("running", "scheduled", "pause", True, "paused", "paused before its next step"),
        ("running", "started", "pause", True, "paused", "pauses when the running step ends"),
        ("paused", "scheduled", "pause", False, "paused", "already paused"),
        ("succeeded", "completed", "pause", False, "succeeded", "the task is succeeded"),
        ("failed", "failed", "pause", False, "failed", "the task is failed"),
        ("paused", "scheduled", "resume", True, "running", "resumed"),
        ("running", "started", "resume", False, "running", "the task is running, not paused"),
        ("failed", "failed", "resume", False, "failed", "the task is failed, not paused"),
        ("failed", "failed", "retry", True, "running",
         "the failed step runs again from its first attempt"),
        ("running", "started", "retry", False, "running",
         "only a failed task can be retried; it is running"),
        ("terminated", "started", "retry", False, "terminated",
         "only a failed task can be retried; it is terminated"),
        ("running", "started", "terminate", True, "terminated", "terminated"),
        ("paused", "scheduled", "terminate", True, "terminated", "terminated"),
        ("failed", "failed", "terminate", False, "failed", "the task is already failed"),
        ("succeeded", "completed", "terminate", False, "succeeded",
         "the task is already succeeded"),
        ("failed", "failed", "restart", True, "running",
         "runs again from its first step under a new epoch"),
        ("terminated", "started", "restart", True, "running",
         "runs again from its first step under a new epoch"),
        ("running", "started", "restart", False, "running",
         "only a failed or terminated task can be restarted; it is running"),
        ("paused", "scheduled", "restart", False, "paused",
         "only a failed or terminated task can be restarted; it is paused"),
        ("succeeded", "completed", "restart", False, "succeeded",
         "only a failed or terminated task can be restarted; it is succeeded"),
    ],
)
def test_controls_follow_the_state_machine(
    state: TaskState, step_state: StepState, action: ControlAction, allowed: bool,
    new_state: TaskState, reason: str,
) -> None:
    decision = decide_control(state, step_state, action, None, 3)
    assert (decision.allowed, decision.new_state, decision.reason) == (allowed, new_state,
                                                                       reason)


def test_pause_of_a_running_step_waits_for_the_step_boundary() -> None:
    assert decide_control("running", "started", "pause", None, 3).at_boundary
    assert not decide_control("running", "scheduled", "pause", None, 3).at_boundary


def test_a_requested_pause_is_not_requested_twice_and_a_resume_withdraws_it() -> None:
    again = decide_control("running", "started", "pause", None, 3, pause_requested=True)
    assert (again.allowed, again.reason) == (False, "a pause is already requested")
    resume = decide_control("running", "started", "resume", None, 3, pause_requested=True)
    assert (resume.allowed, resume.new_state, resume.withdraw_pause) == (True, "running", True)


@pytest.mark.parametrize(
    ("state", "step_index", "allowed", "new_state", "reason"),
    [
        ("paused", 0, True, "paused", "paused at step 0; resume to run it"),
        ("failed", 2, True, "paused", "paused at step 2; resume to run it"),
        ("running", 1, False, "running", "the task is running: pause first"),
        ("paused", 3, False, "paused", "step 3 is out of range 0..2"),
        ("failed", None, False, "failed", "step None is out of range 0..2"),
        ("succeeded", 1, False, "succeeded", "the task is succeeded"),
        ("terminated", 1, False, "terminated", "the task is terminated"),
    ],
)
def test_jump_needs_a_paused_or_failed_task_and_a_step_in_range(
    state: TaskState, step_index: int | None, allowed: bool, new_state: TaskState,
    reason: str,
) -> None:
    decision = decide_control(state, "scheduled", "jump", step_index, 3)
    assert (decision.allowed, decision.new_state, decision.reason) == (allowed, new_state,
                                                                       reason)


@pytest.mark.parametrize(
    ("state", "action", "allowed", "new_state", "reason"),
    [
        ("queued", "pause", True, "paused", "paused: applies when the task reaches the executor"),
        ("queued", "terminate", True, "terminated", "terminated"),
        ("queued", "resume", False, "queued", "the task is queued, not paused"),
        ("queued", "retry", False, "queued", "the task has not reached the executor"),
        ("queued", "jump", False, "queued", "the task has not reached the executor"),
        ("paused", "resume", True, "queued", "the pending pause is withdrawn"),
        ("paused", "pause", False, "paused", "already paused"),
        ("paused", "terminate", True, "terminated", "terminated"),
        ("terminated", "pause", False, "terminated", "the task is terminated"),
    ],
)
def test_controls_before_the_task_reaches_the_executor(
    state: TaskState, action: ControlAction, allowed: bool, new_state: TaskState, reason: str,
) -> None:
    decision = decide_control(state, None, action, 0 if action == "jump" else None, 0,
                              seen=False)
    assert (decision.allowed, decision.new_state, decision.reason) == (allowed, new_state,
                                                                       reason)


@pytest.mark.parametrize(
    ("outcome", "reason", "permanent"),
    [
        ("rejected", "expired", True),
        ("rejected", "stale_epoch", True),
        ("failed", "not_drained", True),
        ("failed", "job_not_here", True),
        ("failed", "node_not_active", True),
        ("failed", "invalid_payload", True),
        ("failed", "not_supported_yet", True),
        ("failed", "injected_failure", False),
        ("failed", "checkpoint_timeout", False),
        ("unknown", "timeout: no answer", False),
    ],
)
def test_rejections_and_permanent_reasons_are_not_retried(
    outcome: str, reason: str, permanent: bool,
) -> None:
    assert is_permanent(outcome, reason) is permanent


def test_permanent_reasons_is_one_extendable_set() -> None:
    assert isinstance(PERMANENT_REASONS, frozenset)
    assert {"not_drained", "job_not_here", "node_not_active"} <= PERMANENT_REASONS


@pytest.mark.parametrize(
    ("outcome", "cause"),
    [("rejected", "rejected"), ("failed", "failed"), ("unknown", "timeout")],
)
def test_the_cause_tells_rejections_from_failures_and_timeouts(outcome: str,
                                                                cause: str) -> None:
    assert failure_cause(outcome) == cause


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(0, 1.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 30.0), (9, 30.0), (500, 30.0)],
)
def test_backoff_doubles_up_to_its_cap(attempt: int, delay: float) -> None:
    assert backoff_s(attempt, 1.0, 30.0) == delay


def test_a_restart_needs_the_task_at_the_executor() -> None:
    decision = decide_control("terminated", None, "restart", None, 0, seen=False)
    assert (decision.allowed, decision.reason) == (False,
                                                   "the task has not reached the executor")
