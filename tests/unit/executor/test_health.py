"""The online step's health check (pure): the node's conditions clear and its agent fault-free
for the hold, each reason named; the wait it asks for ends when the hold does."""

from __future__ import annotations

import pytest

from schemas.events.v1 import HealthCheck, OnlineNode
from services.executor.health import AgentHealth, condition_problem, judge

NOW = 1_000_000.0
CLEAR = {"Ready": "True", "MemoryPressure": "False", "GPUProblem": "False"}
QUIET = AgentHealth(state="offline", fault_count=0, fault_at=NOW - 120.0)


@pytest.mark.parametrize(("conditions", "problem"), [
    (CLEAR, None),
    ({"Ready": "True"}, None),
    ({"Ready": "False"}, "its Ready condition is False"),
    ({"Ready": "Unknown", "GPUProblem": "True"}, "its Ready condition is Unknown"),
    ({}, "its Ready condition is missing"),
    ({**CLEAR, "GPUProblem": "True"}, "its condition GPUProblem True"),
    ({**CLEAR, "GPUProblem": "True", "KernelDeadlock": "True"},
     "its conditions GPUProblem, KernelDeadlock True"),
    (None, "the backend does not know the node"),
])
def test_conditions_are_clear_when_ready_and_no_other_is_true(
    conditions: dict[str, str] | None, problem: str | None,
) -> None:
    assert condition_problem(conditions) == problem


def test_a_node_with_a_problem_condition_is_not_clear_whatever_its_agent_says() -> None:
    verdict = judge(HealthCheck(hold_s=60), {**CLEAR, "GPUProblem": "True"}, QUIET, NOW)
    assert not verdict.clear
    assert verdict.reason == "its condition GPUProblem True"
    # A check that does not ask for clear conditions does not read them.
    assert judge(HealthCheck(conditions_clear=False, hold_s=60),
                 {**CLEAR, "GPUProblem": "True"}, QUIET, NOW).clear


def test_the_hold_counts_from_the_agents_last_fault_and_says_when_it_ends() -> None:
    check = HealthCheck(hold_s=60)
    recent = AgentHealth(state="offline", fault_count=0, fault_at=NOW - 15.0)
    verdict = judge(check, CLEAR, recent, NOW)
    assert not verdict.clear
    assert verdict.reason == "its agent's last fault was 15 s ago (hold 60 s)"
    assert verdict.recheck_s == pytest.approx(45.0)
    assert judge(check, CLEAR, recent, NOW + 45.0).clear
    # Never a fault reported: nothing to hold for.
    assert judge(check, CLEAR, AgentHealth("up", 0, None), NOW).clear


@pytest.mark.parametrize(("agent", "reason"), [
    (None, "its agent has not reported"),
    (AgentHealth("down", 0, None), "its agent is down (not reporting)"),
    (AgentHealth("suspect", 0, NOW - 500.0), "its agent is suspect (not reporting)"),
    (AgentHealth("offline", 2, NOW), "its agent reports 2 fault(s)"),
])
def test_an_agent_silent_or_still_faulty_keeps_the_node_out(
    agent: AgentHealth | None, reason: str,
) -> None:
    verdict = judge(HealthCheck(hold_s=30), CLEAR, agent, NOW)
    assert (verdict.clear, verdict.reason) == (False, reason)


def test_a_check_without_a_hold_does_not_consult_the_agent() -> None:
    assert judge(HealthCheck(), CLEAR, None, NOW).clear
    assert not judge(HealthCheck(), {"Ready": "False"}, None, NOW).clear


def test_the_online_action_names_its_check_or_none() -> None:
    assert OnlineNode(node_id="n1").health_check is None
    action = OnlineNode.model_validate(
        {"node_id": "n1", "health_check": {"conditions_clear": True, "hold_s": 60}})
    assert action.health_check == HealthCheck(conditions_clear=True, hold_s=60.0)
    with pytest.raises(ValueError, match="hold_s"):
        OnlineNode.model_validate({"node_id": "n1", "health_check": {"hold_s": -1}})
    with pytest.raises(ValueError, match="extra"):
        OnlineNode.model_validate({"node_id": "n1", "health_check": {"hold": 60}})
