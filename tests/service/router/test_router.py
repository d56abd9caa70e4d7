"""The router on the real Redis: routing, answers, retries by cause, timeouts, waits, replay."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from common.errors import PermanentError
from common.reportauth import WRONG_SENDER
from schemas.events.v1 import ModelSelected, NodeReport, RunInference
from services.router.decisions import replay_event
from services.router.policy.codec import decode_arm
from services.router.policy.config import SelectorConfig
from services.router.policy.stats import arm_key
from services.shared.redis_client import text
from tests.contracts.examples import examples
from tests.service.router.conftest import CLUSTER, Harness
from tests.unit.router.helpers import served


def action_of(payload: Any) -> RunInference:
    assert isinstance(payload.action, RunInference)
    return payload.action


async def arm_state(h: Harness, model: str, node: str) -> Any:
    raw = await h.redis.hgetall(h.keys.ml_stats(CLUSTER, arm_key(model, node)))
    return decode_arm({text(k): v for k, v in raw.items()})


async def test_a_task_is_sent_to_a_ready_model_and_succeeds(harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [decision] = h.decisions(task.task_id)
    [command] = h.commands(task.task_id)
    action = action_of(command)
    assert decision.status == "selected"
    assert (decision.node, decision.model, decision.version) == (
        command.node_id, action.model, action.version)
    assert decision.command_id == command.command_id
    assert len(decision.candidates) == 9
    assert all(c.eligible for c in decision.candidates if c.reason != "chosen")
    assert action.input == task.input
    assert command.expires_at > command.issued_at
    model = f"{action.model}:{action.version}"
    assert (await arm_state(h, model, command.node_id)).inflight == 1

    h.clock.advance(0.05)
    await h.answer(command)
    [outcome] = h.outcomes(task.task_id)
    assert (outcome.outcome, outcome.final, outcome.state) == ("succeeded", True, "succeeded")
    assert (outcome.node_id, outcome.model, outcome.prediction) == (
        command.node_id, action.model, 0)
    assert outcome.latency_ms == pytest.approx(50.0, abs=1.0)
    arm = await arm_state(h, model, command.node_id)
    assert (arm.inflight, arm.counts.ok) == (0, 1.0)


async def test_an_answer_from_another_node_than_the_attempts_ends_nothing(
        harness: Harness) -> None:
    # Sealed by its node (the subscription checked the MAC), but not the node asked: one
    # node's key must not end, fail or pass another node's attempts.
    h = harness
    await h.fleet()
    task = await h.submit()
    [command] = h.commands(task.task_id)
    other = next(n for n in ("node-001", "node-002", "node-003") if n != command.node_id)
    with pytest.raises(PermanentError) as refused:
        await h.answer(command, "model_fault", sender=other)
    assert refused.value.reason == WRONG_SENDER
    assert h.outcomes(task.task_id) == []
    await h.answer(command)
    [outcome] = h.outcomes(task.task_id)
    assert (outcome.state, outcome.node_id) == ("succeeded", command.node_id)


async def test_the_decision_event_replays_to_the_same_choice(harness: Harness) -> None:
    h = harness
    await h.fleet()
    for _ in range(5):
        task = await h.submit()
        for command in h.commands(task.task_id):
            await h.answer(command)
    for event in h.decisions():
        again = ModelSelected.model_validate_json(event.model_dump_json())
        replayed = replay_event(again)
        assert replayed.chosen is not None
        assert (replayed.status, replayed.chosen.arm, replayed.seed) == (
            event.status, event.chosen, event.seed)
        # The event's verdicts carry 6 decimals (CandidateView.to_dict), the replay exact
        # values: compare them as the event states them.
        assert [v.to_dict()["score"] for v in replayed.candidates] == [
            c.score for c in event.candidates]
        assert [(v.arm, v.eligible, v.state) for v in replayed.candidates] == [
            (c.arm, c.eligible, c.state) for c in event.candidates]


async def test_a_model_fault_is_retried_on_another_model(harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [first] = h.commands(task.task_id)
    await h.answer(first, "model_fault")
    failed, = h.outcomes(task.task_id)
    assert (failed.outcome, failed.cause, failed.attributed_to) == (
        "failed", "model_fault", "model")
    assert (failed.final, failed.state) == (False, "running")
    _, second = h.commands(task.task_id)
    assert action_of(second).attempt == 2
    assert action_of(second).model != action_of(first).model
    await h.answer(second)
    final = h.outcomes(task.task_id)[-1]
    assert (final.attempt, final.outcome, final.final) == (2, "succeeded", True)
    # The failure counted against the model, not the node.
    model_level = await h.redis.hgetall(h.keys.ml_stats(
        CLUSTER, f"model:{action_of(first).model}:{action_of(first).version}"))
    assert float(model_level[b"model_fault"]) == 1.0
    assert not await h.redis.exists(h.keys.ml_stats(CLUSTER, f"node:{first.node_id}")) or \
        float((await h.redis.hgetall(h.keys.ml_stats(
            CLUSTER, f"node:{first.node_id}"))).get(b"model_fault", 0)) == 0.0


async def test_a_node_fault_is_retried_on_another_node(harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [first] = h.commands(task.task_id)
    await h.answer(first, "node_fault")
    assert h.outcomes(task.task_id)[0].attributed_to == "node"
    _, second = h.commands(task.task_id)
    assert second.node_id != first.node_id


async def test_bad_input_is_not_retried_and_counts_against_nobody(harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [command] = h.commands(task.task_id)
    await h.answer(command, "bad_input")
    [outcome] = h.outcomes(task.task_id)
    assert (outcome.final, outcome.state, outcome.cause, outcome.attributed_to) == (
        True, "failed", "bad_input", "neither")
    action = action_of(command)
    arm = await arm_state(h, f"{action.model}:{action.version}", command.node_id)
    assert (arm.inflight, arm.counts.n) == (0, 0.0)


async def test_retries_stop_at_the_limit(make_harness: Any) -> None:
    h: Harness = make_harness(policy=SelectorConfig(max_retries=1, quarantine=False))
    await h.fleet()
    task = await h.submit()
    await h.answer(h.commands(task.task_id)[0], "timeout")
    await h.answer(h.commands(task.task_id)[1], "timeout")
    assert len(h.commands(task.task_id)) == 2
    final = h.outcomes(task.task_id)[-1]
    assert (final.final, final.state, final.attempt) == (True, "failed", 2)
    assert "no retry" in final.reason


async def test_an_attempt_without_an_answer_times_out_and_is_retried(make_harness: Any) -> None:
    h: Harness = make_harness(attempt_timeout_s=1.0)
    await h.fleet()
    task = await h.submit()
    [first] = h.commands(task.task_id)
    h.clock.advance(0.5)
    await h.router.sweep()
    assert h.outcomes(task.task_id) == []
    h.clock.advance(0.6)
    await h.router.sweep()
    timed_out = h.outcomes(task.task_id)[0]
    assert (timed_out.cause, timed_out.attributed_to) == ("timeout", "both")
    _, second = h.commands(task.task_id)
    assert second.node_id != first.node_id
    assert action_of(second).model != action_of(first).model
    # The late answer to the first attempt changes nothing.
    await h.answer(first)
    assert len(h.outcomes(task.task_id)) == 1
    await h.answer(second)
    assert h.outcomes(task.task_id)[-1].state == "succeeded"


async def test_a_duplicate_answer_is_counted_once(harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [command] = h.commands(task.task_id)
    await h.answer(command)
    await h.answer(command, duplicate=True)
    assert len(h.outcomes(task.task_id)) == 1
    action = action_of(command)
    arm = await arm_state(h, f"{action.model}:{action.version}", command.node_id)
    assert arm.counts.ok == 1.0


async def test_a_rejected_command_is_nobodys_fault_and_another_arm_is_tried(
        harness: Harness) -> None:
    h = harness
    await h.fleet()
    task = await h.submit()
    [first] = h.commands(task.task_id)
    await h.answer(first, outcome="rejected")
    outcome = h.outcomes(task.task_id)[0]
    assert (outcome.cause, outcome.attributed_to) == ("unavailable", "neither")
    assert len(h.commands(task.task_id)) == 2


async def test_with_nothing_to_serve_the_task_waits_then_fails_at_its_deadline(
        harness: Harness) -> None:
    h = harness
    task = await h.submit(deadline_s=2.0)
    [decision] = h.decisions(task.task_id)
    assert (decision.status, decision.chosen) == ("no_candidates", None)
    h.clock.advance(1.0)
    await h.router.sweep()
    assert len(h.decisions(task.task_id)) == 1  # the same wait is published once
    h.clock.advance(1.0)
    await h.router.sweep()
    [outcome] = h.outcomes(task.task_id)
    assert (outcome.final, outcome.state, outcome.cause, outcome.node_id) == (
        True, "failed", "no_candidates", None)


async def test_a_model_that_appears_takes_a_waiting_task(harness: Harness) -> None:
    h = harness
    await h.report("node-001", [served("digits-mlp", "1", "mlp", state="loading")])
    task = await h.submit()
    assert h.decisions(task.task_id)[0].status == "no_candidates"
    assert h.decisions(task.task_id)[0].candidates[0].reason == "not ready"
    h.clock.advance(0.3)
    await h.report("node-001", [served("digits-mlp", "1", "mlp")])
    await h.router.sweep()
    [command] = h.commands(task.task_id)
    assert command.node_id == "node-001"


async def test_drained_and_silent_nodes_are_not_ready(harness: Harness) -> None:
    h = harness
    await h.report("node-001", [served("digits-mlp", "1", "mlp")], mode="draining")
    await h.report("node-002", [served("digits-mlp", "1", "mlp")], interval_s=1.0)
    h.clock.advance(11.0)  # node-002's report is now stale
    await h.report("node-003", [served("digits-mlp", "1", "mlp")])
    task = await h.submit()
    [command] = h.commands(task.task_id)
    assert command.node_id == "node-003"
    ready = {c.node: c.eligible for c in h.decisions(task.task_id)[0].candidates}
    assert ready == {"node-001": False, "node-002": False, "node-003": True}


async def test_an_older_report_never_rolls_the_registry_back(harness: Harness) -> None:
    h = harness
    h.seqs["node-001"] = 100
    await h.report("node-001", [served("digits-mlp", "1", "mlp")])
    h.seqs["node-001"] = 5  # a replayed, older report
    await h.report("node-001", [])
    task = await h.submit()
    assert len(h.commands(task.task_id)) == 1


async def test_concurrency_limits_hold_across_router_instances(make_harness: Any) -> None:
    h: Harness = make_harness(instances=2)
    await h.fleet(nodes=("node-001",), models=(("digits-mlp", "1", "mlp"),), limit=2)
    # Two instances route at once: the arm's limit (2) holds across both; the rest wait.
    tasks = [await h.submit(router=i % 2) for i in range(4)]
    sent = [c for t in tasks for c in h.commands(t.task_id)]
    assert len(sent) == 2
    assert "saturated" in {d.status for d in h.decisions()}
    assert (await arm_state(h, "digits-mlp:1", "node-001")).inflight == 2
    # As answers come back the waiting tasks go out, never more than two at a time.
    for _ in range(6):
        for command in h.commands():
            if not any(o.command_id == command.command_id for o in h.outcomes()):
                await h.answer(command, router=1)
                break
        h.clock.advance(0.3)
        for router in h.routers:
            await router.sweep()
        in_flight = [c for c in h.commands()
                     if not any(o.command_id == c.command_id for o in h.outcomes())]
        assert len(in_flight) <= 2
    assert sum(o.state == "succeeded" for o in h.outcomes()) == 4


async def test_when_every_arm_is_quarantined_the_task_still_runs(make_harness: Any) -> None:
    h: Harness = make_harness(policy=SelectorConfig(consecutive_failures=1, max_retries=0,
                                                    max_quarantined_fraction=1.0))
    await h.fleet(nodes=("node-001", "node-002"), models=(("digits-mlp", "1", "mlp"),))
    for _ in range(2):
        task = await h.submit()
        [command] = h.commands(task.task_id)
        await h.answer(command, "model_fault")
    task = await h.submit()
    [decision] = h.decisions(task.task_id)
    assert decision.status == "panic"
    assert len(h.commands(task.task_id)) == 1


async def test_events_left_by_a_failed_publish_go_out_later(harness: Harness) -> None:
    h = harness
    await h.fleet()
    h.bus.down = True
    event = h.submit_event()
    with pytest.raises(ConnectionError):
        await h.router.on_submitted(event)
    assert h.bus.sent == []
    h.bus.down = False
    await h.router.on_submitted(event)  # redelivered: the record exists, the outbox goes out
    assert len(h.decisions(event.task_id)) == 1
    assert len(h.commands(event.task_id)) == 1
    await h.router.on_submitted(event)  # and nothing is sent twice
    assert len(h.commands(event.task_id)) == 1


async def test_a_node_nobody_enrolled_serves_nothing(harness: Harness) -> None:
    h = harness
    report = examples()["node_report"]
    stranger = NodeReport.model_validate(report.model_dump() | {
        "event_id": uuid4(), "subject": "node-666", "node_id": "node-666",
        "occurred_at": h.clock.moment})
    await h.router.on_report(stranger)
    task = await h.submit()
    assert h.decisions(task.task_id)[0].status == "no_candidates"


async def test_a_task_its_router_dropped_is_taken_over_by_the_sweep(make_harness: Any) -> None:
    h: Harness = make_harness(attempt_timeout_s=30.0)
    await h.fleet()
    h.bus.down = True
    event = h.submit_event(deadline_s=60.0)
    with pytest.raises(ConnectionError):
        await h.router.on_submitted(event)
    h.bus.down = False
    await h.router.sweep()
    assert h.commands(event.task_id) == []  # not yet: the safety net's lease runs
    h.clock.advance(10.0)
    await h.router.sweep()
    [command] = h.commands(event.task_id)
    await h.answer(command)
    assert h.outcomes(event.task_id)[-1].state == "succeeded"
    assert await h.redis.zscore(h.keys.ml_due(), str(event.task_id)) is None


async def test_no_task_goes_to_a_node_an_open_breaker_stops(harness: Harness) -> None:
    h = harness
    await h.fleet()
    holds = h.keys.breaker_holds(CLUSTER)
    # node-001 and node-002 stopped by node-scoped breakers; a cluster-scoped one stops ops
    # automation only, not ML routing.
    await h.redis.sadd(holds, "offline@node-001", "migrate@node-002", "scale_in@*")
    tasks = [await h.submit() for _ in range(6)]
    assert {c.node_id for t in tasks for c in h.commands(t.task_id)} == {"node-003"}
    # Reset: the node serves again once the cached read (1 s) has lapsed.
    await h.redis.srem(holds, "offline@node-001", "migrate@node-002")
    h.clock.advance(1.5)
    nodes: set[str] = set()
    for _ in range(30):
        task = await h.submit()
        nodes |= {c.node_id for c in h.commands(task.task_id)}
        [command] = h.commands(task.task_id)
        await h.answer(command)
    assert nodes - {"node-003"}, nodes


async def test_a_task_record_is_kept_a_bounded_time_and_a_finished_one_much_less(
        make_harness: Any) -> None:
    h: Harness = make_harness(record_ttl_s=7_200, finished_record_ttl_s=600)
    await h.fleet()
    task = await h.submit(deadline_s=10.0)
    record = h.keys.ml_task(str(task.task_id))
    assert 7_100 < await h.redis.ttl(record) <= 7_200  # unfinished: the cap
    [command] = h.commands(task.task_id)
    await h.answer(command)
    assert h.outcomes(task.task_id)[-1].final
    # Finished: kept a while past its deadline (10 s away), not for the cap.
    assert 600 < await h.redis.ttl(record) <= 610
