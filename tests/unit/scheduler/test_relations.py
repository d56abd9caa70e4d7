"""The relation policy (pure): which open task holds a task back and why, what depends_on waits
for and when it fails the dependent, and what concurrent_with lifts."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.events.v1 import Dependency, ExclusiveWith, RelationScope, TaskRelations
from services.scheduler.relations import (
    OpenTask,
    concurrency_hold,
    conflict,
    decide,
    dependencies,
)

pytestmark = pytest.mark.unit
NOW = 1_000_000


def entry(task_id: str, template: str, *, pool: str = "p1", target: str = "n1",
          state: str = "running", lapses_at_ms: int = NOW + 60_000, **relations: Any) -> OpenTask:
    return OpenTask(task_id=task_id, template=template, pool=pool, target=target,
                    state=state,  # type: ignore[arg-type]
                    lapses_at_ms=lapses_at_ms if state == "running" else 0,
                    relations=TaskRelations(template=template, **relations))


def excl(template: str, scope: RelationScope = "cluster") -> list[ExclusiveWith]:
    return [ExclusiveWith(template=template, scope=scope)]


def test_two_templates_on_one_pool_do_not_overlap_by_default() -> None:
    me = entry("a", "offline", state="queued")
    reason = conflict(me, entry("b", "scale_in"), NOW)
    assert reason == ("task b (scale_in) runs on pool p1, and neither template is "
                      "concurrent_with the other")
    # Another pool, or the same template (its concurrency bounds it): no hold.
    assert conflict(me, entry("b", "scale_in", pool="p2"), NOW) is None
    assert conflict(me, entry("b", "offline"), NOW) is None


@pytest.mark.parametrize("side", ["mine", "theirs"])
def test_concurrent_with_on_either_side_lifts_the_default(side: str) -> None:
    me = entry("a", "offline", state="queued",
               concurrent_with=["scale_in"] if side == "mine" else [])
    other = entry("b", "scale_in", concurrent_with=["offline"] if side == "theirs" else [])
    assert conflict(me, other, NOW) is None


@pytest.mark.parametrize(
    ("scope", "other_pool", "other_target", "held"),
    [("cluster", "p2", "n2", True), ("pool", "p2", "n1", False), ("pool", "p1", "n2", True),
     ("target", "p1", "n2", False), ("target", "p2", "n1", True)],
)
def test_exclusive_with_holds_within_its_scope(scope: RelationScope, other_pool: str,
                                               other_target: str, held: bool) -> None:
    # concurrent_with lifts the default on the pool, so only the exclusion can hold.
    me = entry("a", "offline", state="queued", exclusive_with=excl("fw", scope))
    other = entry("b", "fw", pool=other_pool, target=other_target,
                  concurrent_with=["offline"])
    reason = conflict(me, other, NOW)
    assert (reason is not None) == held
    if held:
        assert reason is not None
        assert reason.startswith("exclusive_with fw")
        assert "task b (fw) runs" in reason


def test_an_exclusion_the_other_side_declares_holds_too() -> None:
    me = entry("a", "offline", state="queued", concurrent_with=["fw"])
    other = entry("b", "fw", exclusive_with=excl("offline"))
    # Named from the held side: the relation to fw, whichever template declared it.
    assert conflict(me, other, NOW) == "exclusive_with fw in the cluster: task b (fw) runs"


def test_only_running_unlapsed_tasks_hold_others_back() -> None:
    me = entry("a", "offline", state="queued", exclusive_with=excl("fw"))
    assert conflict(me, entry("b", "fw", state="queued"), NOW) is None
    assert conflict(me, entry("b", "fw", lapses_at_ms=NOW - 1), NOW) is None


def test_depends_on_takes_the_open_tasks_in_scope_at_enqueue() -> None:
    me = entry("a", "offline", state="queued",
               depends_on=[Dependency(template="check", scope="target")])
    others = [entry("b", "check"), entry("c", "check", state="queued"),
              entry("d", "check", target="n2"), entry("e", "other")]
    assert dependencies(me, others) == (("b", "check"), ("c", "check"))


def waiting(on_failure: str = "fail") -> OpenTask:
    rel = TaskRelations(template="offline", concurrent_with=["check"],
                        depends_on=[Dependency(template="check",
                                               on_failure=on_failure)])  # type: ignore[arg-type]
    return OpenTask(task_id="a", template="offline", pool="p1", target="n1", relations=rel,
                    waits_for=(("b", "check"),))


def test_a_dependent_waits_while_the_other_is_open() -> None:
    for state in ("queued", "running"):
        decision = decide(waiting(), [entry("b", "check", state=state)], {}, NOW)
        assert (decision.verdict, decision.blocker) == ("hold", "depends:b")
        assert decision.reason == "depends_on check: waits for task b to finish"


@pytest.mark.parametrize(
    ("outcome", "on_failure", "verdict"),
    [("succeeded", "fail", "admit"), ("failed", "fail", "fail"),
     ("terminated", "fail", "fail"), ("failed", "proceed", "admit"),
     (None, "fail", "admit")],
)
def test_a_finished_dependency_admits_or_fails_as_the_rule_says(
        outcome: str | None, on_failure: str, verdict: str) -> None:
    decision = decide(waiting(on_failure), [], {"b": outcome}, NOW)
    assert decision.verdict == verdict
    if verdict == "fail":
        assert decision.reason == f"depends_on check: task b {outcome}"
        assert decision.outputs == {"cause": "dependency_failed", "dependency": "b"}


def test_dependencies_come_before_conflicts_and_admit_when_clear() -> None:
    me = waiting()
    running = entry("x", "scale_in")
    assert decide(me, [entry("b", "check"), running], {}, NOW).blocker == "depends:b"
    assert decide(me, [running], {"b": "succeeded"}, NOW).blocker == "runs:x"
    assert decide(me, [me], {"b": "succeeded"}, NOW).verdict == "admit"


def test_an_entry_round_trips_through_its_json() -> None:
    me = waiting("proceed")
    assert OpenTask.from_json(me.to_json()) == me


def test_the_concurrency_hold_names_the_limit() -> None:
    hold = concurrency_hold(entry("a", "offline", concurrency=2), "east", 2)
    assert (hold.verdict, hold.blocker) == ("hold", "concurrency:offline")
    assert hold.reason == "concurrency: 2 of 2 offline task(s) run on east"
