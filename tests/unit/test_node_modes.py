"""The node state a report's mode implies, shared by the collector and the analyzer."""

from __future__ import annotations

from typing import get_args

from schemas.events.v1 import NodeMode, state_from_mode


def test_every_mode_has_a_state_and_a_reporting_node_is_up_unless_it_left() -> None:
    assert {mode: state_from_mode(mode) for mode in get_args(NodeMode)} == {
        "active": "up", "draining": "draining", "offline": "offline",
    }
