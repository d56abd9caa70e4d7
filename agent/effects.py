"""What executing a command does: its outcome, and the side effects still to perform."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from schemas.events.v1 import InferenceOutput, NodeMode, OutputValue

Outcome = Literal["succeeded", "failed", "rejected", "unknown"]

# The journal's mark of a long action that was accepted and has not finished yet; query_status
# answers it as ("unknown", IN_PROGRESS).
IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class Effect:
    """An action's outcome on the node, and what to do about it once it may be done.

    Deciding never changes anything: `mode` and `interval_s` are persisted with the result,
    `apply` runs now and `run` in the background, and a dry run or an injected failure does
    neither. `plan` says, for a dry run, what the side effects would be.
    """

    outcome: Outcome
    reason: str = ""
    mode: NodeMode | None = None
    outputs: dict[str, OutputValue] = field(default_factory=dict)
    interval_s: float | None = None
    apply: Callable[[], Effect] | None = None
    run: Callable[[], Awaitable[Effect]] | None = None
    plan: str = ""
    inference: InferenceOutput | None = None
