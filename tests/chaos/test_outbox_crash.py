"""A state change and its event are one unit (docs/reliability.md S1, S2, S23), on the real
broker, Redis and service processes: each service is killed (as a kill -9, through a crash
point) after it changed state in Redis and before it published the event that announces the
change. Restarted, the event goes out, exactly once.

Before the outbox each of these lost its event for good: the analyzer's open-need mark kept
the need from being raised again for its TTL, the collector's sweep found the node already
suspect, and the executor's journal was already final.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent import fleet
from schemas.events.v1 import NodeState, OpsNeed
from schemas.topics import Topic
from services.executor.journal import Journal
from services.shared.redis_client import Keys
from tests.chaos.harness import (
    CLUSTER,
    FLOW,
    TARGET,
    all_up,
    crashed,
    fault_env,
    restart,
    stack_with_fleet,
)
from tests.integration.harness import (
    Tap,
    a_need,
    is_success_of,
    name,
    tap,
    task_events_for,
    until,
)
from tests.integration.test_detection import analyzer_past, samples_of


def needs_for(watch: Tap, node: str) -> list[OpsNeed]:
    return [OpsNeed.model_validate_json(r.value) for r in watch.records
            if r.topic.endswith(Topic.OPS_NEEDS.value) and r.key == node.encode()]


def states_of(watch: Tap, node: str, state: str, start: int = 0) -> list[NodeState]:
    return [NodeState.model_validate_json(r.value) for r in watch.records[start:]
            if r.topic.endswith(Topic.OPS_NODE_STATE.value) and r.key == node.encode()
            and f'"state":"{state}"'.encode() in r.value]


async def test_a_need_marked_open_by_an_analyzer_that_died_is_still_raised_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    point = "analyzer.after_open_need"
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, point)
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env,
                                 ("collector", "analyzer", "templater")) as running,
                tap(kafka_bootstrap, name(Topic.OPS_NEEDS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_TASKS, namespace),
                    name(Topic.OPS_SAMPLES, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        index = await crashed(running, "analyzer", point)
        # The need is marked open, and was never published.
        redis = Redis.from_url(redis_url)
        try:
            assert await redis.exists(Keys(namespace).open_need(CLUSTER, "offline",
                                                                TARGET))
        finally:
            await redis.aclose()
        await watch.catch_up()
        assert needs_for(watch, TARGET) == []

        restart(running, index, tmp_path, env)
        need = OpsNeed.model_validate_json(
            (await watch.wait_for(a_need("offline", TARGET), 90,
                                  "the need the dead analyzer left")).value)
        await watch.wait_for(
            lambda r: r.topic.endswith(Topic.OPS_TASKS.value)
            and str(need.event_id).encode() in r.value, 60, "its task")
        # Faulty samples go on arriving and being judged: the need stays raised once.
        later = await samples_of(watch, TARGET, 3, start=len(watch.records))
        await analyzer_past(kafka_bootstrap, namespace, later,
                            "the restarted analyzer past later samples")
        await watch.catch_up()
        assert [n.event_id for n in needs_for(watch, TARGET)] == [need.event_id]


async def test_a_state_change_swept_by_a_collector_that_died_is_still_announced_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    point = "collector.after_mark_silent"
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, point)
    env["COLLECTOR_DOWN_AFTER_S"] = "8"
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env,
                                 ("collector",)) as running,
                tap(kafka_bootstrap, name(Topic.OPS_NODE_STATE, namespace)) as watch):
        await all_up(watch)
        mark = len(watch.records)
        assert fleet.kill_agent(tmp_path, TARGET)
        index = await crashed(running, "collector", point)
        redis = Redis.from_url(redis_url)
        try:
            state = await redis.hget(Keys(namespace).node(CLUSTER, TARGET), "state")
        finally:
            await redis.aclose()
        assert state == b"suspect"  # changed in Redis, and never announced
        await watch.catch_up()
        assert states_of(watch, TARGET, "suspect", mark) == []

        restart(running, index, tmp_path, env)
        await watch.wait_for(
            lambda r: bool(states_of(watch, TARGET, "down", mark)), 90,
            f"{TARGET} down")
        await watch.catch_up()
        suspect = states_of(watch, TARGET, "suspect", mark)
        assert [(s.previous, s.state) for s in suspect] == [("up", "suspect")], suspect
        down = states_of(watch, TARGET, "down", mark)
        assert [(s.previous, s.state) for s in down] == [("suspect", "down")], down


@pytest.mark.timeout(300)
async def test_a_task_ended_by_an_executor_that_died_is_still_announced_once(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    point = "executor.before_final_event"
    env = fault_env(kafka_bootstrap, redis_url, namespace, tmp_path, point)
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW) as running,
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        index = await crashed(running, "executor", point)
        journal = Journal(Redis.from_url(redis_url), Keys(namespace))
        try:
            [owed] = await journal.unannounced(2**62)
            wf = await journal.load(owed)
            assert wf is not None
            assert wf.state == "succeeded"  # final in the journal, never announced
            await watch.catch_up()
            assert not any(e.state == "succeeded"
                           for e in task_events_for(watch, TARGET))

            restart(running, index, tmp_path, env)
            await watch.wait_for(is_success_of(watch, TARGET), 90,
                                 "the final event the dead executor owed")

            async def nothing_owed() -> bool:
                return await journal.unannounced(2**62) == []

            await until(nothing_owed, 30, "nothing owed any more")
        finally:
            await journal.redis.aclose()
        await watch.catch_up()
        final = [e for e in task_events_for(watch, TARGET)
                 if e.state in ("succeeded", "failed", "terminated")]
        assert [(str(e.task_id), e.state) for e in final] == [(owed, "succeeded")]
        assert final[0].outputs.get("need_kind") == "offline"

