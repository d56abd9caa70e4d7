"""The readable lines `warden events` and `warden demo` print for each watched event."""

from __future__ import annotations

import pytest

from schemas.topics import Topic
from services.cli import WATCHED, describe
from tests.contracts.examples import examples

GOLDEN_OF = {
    Topic.OPS_NODE_STATE: ("node_state", ["node-003", "suspect -> down", "no report"]),
    Topic.OPS_NEEDS: ("ops_need", ["offline", "node-002", "node_fault_count=1"]),
    Topic.OPS_TASK_EVENTS: ("task_event", ["running step 0 completed", "drain completed"]),
    Topic.OPS_ALERTS: ("alert", ["ALERT", "critical", "breaker_open"]),
}


@pytest.mark.parametrize("topic", WATCHED)
def test_every_watched_event_has_a_readable_line(topic: Topic) -> None:
    name, expected = GOLDEN_OF[topic]
    line = describe(topic, examples()[name].model_dump_json().encode())
    for part in expected:
        assert part in line
