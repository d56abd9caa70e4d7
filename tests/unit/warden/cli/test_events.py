"""The readable lines `warden events` and `warden demo` print for each watched event."""

from __future__ import annotations

import pytest

from schemas.topics import Topic
from tests.contracts.examples import examples
from warden.cli.events import WATCHED, describe, step_effect

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


def test_a_step_that_moved_a_job_or_added_a_node_says_so() -> None:
    resumed = step_effect({"job_id": "node-002.train", "started": True, "resumed_step": 152})
    assert "job node-002.train runs again, from step 152" in resumed
    saved = step_effect({"job_id": "node-002.train", "checkpoint": "node-002.train",
                         "step": 150})
    assert "checkpointed at step 150" in saved
    added = step_effect({"added": 1, "added_nodes": "standby-1",
                         "reason": "3 nodes at 90% -> add 1 node"})
    assert "added standby-1: 3 nodes at 90% -> add 1 node" in added
    assert step_effect({"added": 0, "reason": "no standby capacity"}) == ""
    assert step_effect({"mode": "draining"}) == ""
