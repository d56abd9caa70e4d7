"""The circuit breaker on the real broker and Redis: failed drains trip it, an alert is raised,
further offline tasks stay queued, and the breaker is still open after a scheduler restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import Alert
from schemas.topics import Topic
from services.scheduler.breaker import BreakerConfig, Outcome
from services.scheduler.breaker_store import UNREADABLE, BreakerStore
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from tests.integration.harness import (
    Record,
    Tap,
    is_up,
    log_shows,
    name,
    services,
    stack_env,
    tap,
    task_events_for,
)
from warden import launcher

GENTLE = BreakerConfig(disruptive=False, wait_s=0.0)
# Dispatcher ticks a held task must be seen held back in before its absence is judged.
TICKS = 5


def alerts(events: Tap) -> list[Alert]:
    return [Alert.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_ALERTS.value)]


def has_state(events: Tap, target: str, state: str) -> bool:
    return any(e.state == state for e in task_events_for(events, target))


def state_seen(events: Tap, target: str, state: str) -> Callable[[Record], bool]:
    """A predicate for `Tap.wait_for`: a task of `target` reached `state`."""
    return lambda _: has_state(events, target, state)


async def test_two_schedulers_cannot_both_take_the_half_open_trial(
    redis_url: str, namespace: str
) -> None:
    redis = connect_redis(redis_url)
    try:
        stores = [BreakerStore(redis, Keys(namespace), lambda _: GENTLE) for _ in range(2)]
        for i in range(3):
            await stores[0].record("c1", "online", Outcome(task_id=f"t{i}", failed=True))
        decisions = await asyncio.gather(
            *(store.admit("c1", "online", f"trial-{i}") for i in range(8)
              for store in stores))
        assert sum(d.allowed for d, _ in decisions) == 1
        state, _ = await stores[1].load("c1", "online")
        assert state.status == "HALF_OPEN"
        # A redelivered outcome is counted once.
        assert await stores[0].record("c1", "online", Outcome(task_id="t2", failed=True)) is None
    finally:
        await redis.aclose()


async def test_an_unreadable_breaker_admits_nothing(namespace: str) -> None:
    # Nothing listens on port 1: every read fails, as with Redis down.
    redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1.0)
    try:
        store = BreakerStore(redis, Keys(namespace), lambda _: GENTLE)
        decision, state = await store.admit("c1", "offline", "t1")
        assert (decision.allowed, decision.reason, state) == (False, UNREADABLE, None)
    finally:
        await redis.aclose()


async def test_failed_drains_open_the_breaker_which_survives_a_scheduler_restart(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    WARDEN_LOG_LEVEL="INFO")
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    breaker_key = BreakerStore(redis, Keys(namespace), lambda _: GENTLE).key("itest", "offline")
    async with services(env, tmp_path) as running:
        agents = fleet.fleet_up(3, 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        await register(redis_url, namespace, "itest", [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_ALERTS, namespace)) as watch:
                for node in ("node-001", "node-002", "node-003"):
                    await watch.wait_for(is_up(node), 60, f"{node} up")
                    fleet.inject_fault(tmp_path, node, fail_actions=["drain_node"])

                for node in ("node-002", "node-003", "node-001"):
                    fleet.inject_fault(tmp_path, node, xid=[79])
                    await watch.wait_for(state_seen(watch, node, "failed"), 30,
                                         f"the offline task for {node} to fail")

                alert = await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.OPS_ALERTS.value), 15, "the alert")
                raised = Alert.model_validate_json(alert.value)
                assert (raised.severity, raised.kind, raised.dedup_key) == (
                    "critical", "breaker_open", "breaker.itest.kind.offline")
                assert await redis.hget(breaker_key, "status") == b"OPEN"

                # A restarted scheduler reads the open breaker back from Redis.
                index = next(i for i, s in enumerate(running) if s.name == "scheduler")
                launcher.stop_services([running[index]])
                running[index] = launcher.start_services(tmp_path, env, ("scheduler",))[0]

                newcomer = fleet.fleet_up(1, 2, "itest", namespace, tmp_path, env, trusted,
                                          1.0, first=4)[0].node_id
                await register(redis_url, namespace, "itest", [newcomer])
                await watch.wait_for(is_up(newcomer), 60, f"{newcomer} up")
                fleet.inject_fault(tmp_path, newcomer, xid=[79])
                await watch.wait_for(state_seen(watch, newcomer, "queued"), 30,
                                     f"the offline task for {newcomer} to be queued")
                held = next(e.task_id for e in task_events_for(watch, newcomer))
                # The restarted scheduler holds it back on every dispatcher tick (the only
                # offline task queued, its breaker is asked each time): once it has said so
                # TICKS times, the ticks before the last have ended, and whatever they
                # published (a dispatch, another alert) is on the topics.
                await log_shows(running[index].log_path,
                                lambda line: f"task {held} held back by breaker itest/offline"
                                in line, f"task {held} held back by the restarted scheduler",
                                count=TICKS)
                await watch.catch_up()

                trail = [e.state for e in task_events_for(watch, newcomer)]
                assert "dispatched" not in trail, trail
                keys = Keys(namespace)
                # Still queued (or held for the moment of a dispatcher tick), never lost.
                assert (await redis.zscore(keys.queue_ready(), str(held)) is not None
                        or await redis.zscore(keys.queue_inflight(), str(held)) is not None)
                assert await redis.hget(breaker_key, "status") == b"OPEN"
                # One opening, one alert, however many tasks (and ticks) it held back.
                assert len(alerts(watch)) == 1
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
