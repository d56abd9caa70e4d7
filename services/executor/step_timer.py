"""How long each step attempt takes, for `warden.executor.step.duration` (common/metrics.py).

The journal keeps a step's deadline, not its start (recovery moves the deadline), so the start
of each attempt is remembered here, in memory, by its command id. An attempt that started in
another executor instance, or before this one restarted, has no start here and is not timed:
a duration made up from its deadline would be wrong by however often it was extended.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from common.metrics import STEP_DURATION, Instruments, instruments
from schemas.events.v1 import OpsTask

# Attempts in flight at once are far fewer; the oldest are forgotten beyond this.
MAX_STARTED: Final = 10_000


class StepTimer:
    """Remembers when each attempt started; records its duration when it ends."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 recorded: Instruments | None = None) -> None:
        self._clock = clock
        self._histogram = (recorded or instruments()).histogram(STEP_DURATION)
        self._started: OrderedDict[str, float] = OrderedDict()

    def started(self, command_id: str) -> None:
        self._started[command_id] = self._clock()
        while len(self._started) > MAX_STARTED:
            self._started.popitem(last=False)

    def ended(self, task: OpsTask, step: int, command_id: str, outcome: str) -> None:
        """The attempt `command_id` of `task`'s step `step` ended with `outcome`
        (completed or failed)."""
        start = self._started.pop(command_id, None)
        if start is None:
            return
        self._histogram.record(max(0.0, self._clock() - start),
                               {"action": task.steps[step].action.action, "outcome": outcome})
