"""docs/reliability.md S7 and S8 on a broker of the test's own, with the real Redis, service and
agent processes: while an offline task drains a node, the broker is killed (kill -9, started
again 5 s later on the same data) or hung (SIGSTOP for 30 s, then SIGCONT). No service dies or
loops on the outage; afterwards the task runs to success once (the agent drains and takes the
node offline once, one final event), and an outage is no adjustment failure: no breaker
counted it. And the check the executor makes before it fails a wait for an agent finds a hung
broker unreachable (so the wait starts over rather than counting as a timeout)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent import fleet
from common.clock import epoch_ms
from common.errors import InfrastructureUnavailable
from common.settings import ServiceSettings
from schemas.events.v1 import now_utc
from schemas.topics import Topic
from services.executor.broker_health import BrokerHealth, MetadataProbe
from services.scheduler.breaker import BreakerConfig
from services.scheduler.breaker_store import BreakerStore
from services.shared.redis_client import Keys, connect_redis
from tests.chaos.conftest import PrivateBroker
from tests.chaos.harness import FLOW, TARGET, all_up, fault_env, stack_with_fleet
from tests.chaos.test_graceful_stop import drain_started
from tests.integration.harness import is_success_of, name, tap, task_events_for
from tests.integration.test_executor_crash import journal_rows
from tests.integration.test_operator_control import UPKEEP_ACTIONS


def no_config(name: str) -> BreakerConfig:
    raise AssertionError(f"reading breaker {name} needs no limits")


async def outage(broker: PrivateBroker, kind: str) -> None:
    if kind == "killed":
        broker.kill()
        await asyncio.sleep(5)
        await asyncio.to_thread(broker.start)
    else:
        broker.pause()
        await asyncio.sleep(30)
        broker.resume()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("kind", ["killed", "hung"])
async def test_a_broker_outage_mid_task_loses_nothing_and_counts_against_no_breaker(
    private_kafka: PrivateBroker, redis_url: str, namespace: str, tmp_path: Path, kind: str
) -> None:
    bootstrap = private_kafka.bootstrap
    env = fault_env(bootstrap, redis_url, namespace, tmp_path, "")
    async with (stack_with_fleet(redis_url, namespace, tmp_path, env, FLOW),
                tap(bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace)) as watch):
        await all_up(watch)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await watch.wait_for(drain_started(watch), 90, "the drain on the agent")
        await outage(private_kafka, kind)
        await watch.wait_for(is_success_of(watch, TARGET), 240,
                             f"the offline task to succeed after the broker was {kind}")
        await watch.catch_up()
        events = task_events_for(watch, TARGET)
        final = [e for e in events if e.state in ("succeeded", "failed", "terminated")]
        assert [e.state for e in final] == ["succeeded"], [e.reason for e in events]
        assert not [e for e in events if e.step_state == "failed"], [e.reason for e in events]
        # Every service is still the process it was (services() fails the test otherwise).
    redis = connect_redis(redis_url)
    try:
        breakers = await BreakerStore(redis, Keys(namespace), no_config).states()
    finally:
        await redis.aclose()
    # The task succeeded, so a breaker may have counted its success; never a failure.
    assert all(state is None or not any(state.window) for _, _, state in breakers), breakers
    acted = [(r[1], r[2]) for r in journal_rows(tmp_path, TARGET)
             if r[1] not in UPKEEP_ACTIONS | {"query_status"}]
    assert acted == [("drain_node", "succeeded"), ("offline_node", "succeeded")], acted


@pytest.mark.timeout(180)
async def test_a_hung_broker_is_found_unreachable_and_remembered(
    private_kafka: PrivateBroker, redis_url: str, namespace: str
) -> None:
    """The executor's check before it fails a wait for an agent, against a real broker hung
    by SIGSTOP (connections open, no answers): unreachable within the probe's timeout, and
    the outage remembered for the waits that spanned it; answered again once it resumes."""
    redis = connect_redis(redis_url)
    probe = MetadataProbe(ServiceSettings(kafka_bootstrap_servers=private_kafka.bootstrap))
    health = BrokerHealth(redis, Keys(namespace), now_utc, probe)
    began_ms = epoch_ms(now_utc())
    try:
        assert not await health.unreachable_since(began_ms)
        private_kafka.pause()
        try:
            with pytest.raises(InfrastructureUnavailable):
                await health.unreachable_since(began_ms)
        finally:
            private_kafka.resume()
        assert await health.unreachable_since(began_ms)
        assert not await health.unreachable_since(epoch_ms(now_utc()) + 1)
    finally:
        await probe.close()
        await redis.aclose()
