"""Pure scheduling decisions."""

from __future__ import annotations

from schemas.events.v1 import OpsTask

# Priority first (0 is most urgent), then first come first served within a priority.
PRIORITY_WEIGHT = 10**13


def queue_score(task: OpsTask) -> int:
    """The sorted-set score of a task: lower is served first."""
    return task.priority * PRIORITY_WEIGHT + int(task.occurred_at.timestamp() * 1000)


def lock_ttl_s(task: OpsTask, margin_s: float) -> float:
    """How long a task's locks live if nobody releases them: its worst-case run plus a margin."""
    return sum(step.timeout_s * step.max_attempts for step in task.steps) + margin_s
