"""Pure scheduling decisions."""

from __future__ import annotations

from schemas.events.v1 import OpsTask

# Priority first (0 is most urgent), then first come first served within a priority.
PRIORITY_WEIGHT = 10**13


def queue_score(task: OpsTask) -> int:
    """The sorted-set score of a task: lower is served first."""
    return task.priority * PRIORITY_WEIGHT + int(task.occurred_at.timestamp() * 1000)
