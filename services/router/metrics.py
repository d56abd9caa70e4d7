"""What the router measures (common/metrics.py): each attempt's outcome and duration per
model, version and node, the one place a series per node is wanted (which node serves a
model badly is the question a routing dashboard answers).

Recorded from the outcome events as the router publishes them from a task's outbox, so each
is counted once its decision has committed; an outbox published again after a crash counts
its outcomes again (rare, and never lost).
"""

from __future__ import annotations

from common.metrics import ROUTING_ATTEMPTS, ROUTING_LATENCY, Instruments, instruments
from schemas.envelope import Envelope
from schemas.events.v1 import MlTaskOutcome


def record_published(event: Envelope, recorded: Instruments | None = None) -> None:
    """Count `event` if it is an attempt's outcome (a task that never got an attempt has no
    model or node to count against)."""
    if not isinstance(event, MlTaskOutcome) or event.model is None or event.node_id is None:
        return
    recorded = recorded or instruments()
    arm = {"model": event.model, "version": event.version or "", "node": event.node_id}
    recorded.counter(ROUTING_ATTEMPTS).add(1, arm | {"outcome": event.cause or "ok"})
    if event.latency_ms is not None:
        recorded.histogram(ROUTING_LATENCY).record(event.latency_ms / 1000.0, arm)
