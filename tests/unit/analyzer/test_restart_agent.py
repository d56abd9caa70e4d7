"""The restart-agent need: only a suspect node the collector marked agent dead raises it."""

from __future__ import annotations

import pytest

from schemas.events.v1 import NodeStateName
from services.analyzer.needs import offline, restart_agent
from tests.unit.analyzer.timeline import at, node, report_id

ARGS = restart_agent.Args()


@pytest.mark.parametrize(
    ("state", "agent_dead", "raised"),
    [
        pytest.param("suspect", True, True, id="silent, peers reach it"),
        pytest.param("suspect", False, False, id="silent, nothing known yet"),
        pytest.param("down", False, False, id="down: offline, not a restart"),
        pytest.param("up", True, False, id="reporting again"),
        pytest.param("offline", True, False, id="out of service"),
    ],
)
def test_restart_agent_need(state: NodeStateName, agent_dead: bool, raised: bool) -> None:
    obs = node(0, state=state, agent_dead=agent_dead,
               reason="no report for 31.0s; agent dead: 2 peer(s) reach it, 0 cannot")
    needs = restart_agent.detect(obs, ARGS, at(5), "analyzer")
    assert bool(needs) == raised
    for need in needs:
        assert (need.kind, need.target, need.pool, need.level) == (
            "restart_agent", "node-007", "train", "node")
        assert need.evidence[0].metric == "agent_dead"
        assert "agent dead" in need.evidence[0].detail
        assert need.evidence[0].source_event_id == report_id(0)
        # The same observation gives the same need (deduplicated downstream).
        assert restart_agent.detect(obs, ARGS, at(9), "analyzer")[0].event_id == need.event_id


def test_a_dead_agent_is_not_an_offline_need() -> None:
    obs = node(0, state="suspect", agent_dead=True)
    assert offline.detect(obs, offline.Args(), at(5), "analyzer") == []
