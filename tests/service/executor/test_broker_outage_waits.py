"""A wait for an agent that spans a broker outage is no timeout (executor/broker_health.py):
while the broker cannot be reached nothing fails; after it, the wait starts over once, the
status query still outstanding; a wait with no outage in it fails as before. And the probe
itself against the real broker, and against a port where no broker listens."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError
from redis.asyncio import Redis

from common.errors import InfrastructureUnavailable
from common.settings import ServiceSettings
from schemas.events.v1 import CommandPayload, OpsTask
from services.executor.broker_health import UNREACHABLE, BrokerHealth, MetadataProbe
from services.executor.settings import ExecutorSettings
from services.shared.redis_client import Keys
from tests.service.executor.test_handlers import (
    Harness,
    drain_offline,
    make_harness,
    overdue_with_query,
)

QUERY_TIMEOUT_S = 5.0


class SwitchedProbe:
    """A broker the test takes down and brings back."""

    def __init__(self) -> None:
        self.down = False

    async def __call__(self) -> None:
        if self.down:
            raise KafkaConnectionError("no broker")


@pytest.fixture
def probe() -> SwitchedProbe:
    return SwitchedProbe()


@pytest.fixture
def harness(redis: Redis, keys: Keys, tmp_path: Path, probe: SwitchedProbe) -> Harness:
    return make_harness(redis, keys, tmp_path, ExecutorSettings(
        status_query_timeout_s=QUERY_TIMEOUT_S, max_status_queries=1), broker_probe=probe)


async def query_wait_over(harness: Harness, task: OpsTask) -> None:
    """The clock moves past the end of the outstanding query's wait."""
    harness.clock.now += timedelta(seconds=QUERY_TIMEOUT_S + 1)
    tid = str(task.task_id)
    deadline = harness.clock.ms() - 1
    await harness.redis.zadd(harness.keys.workflow_deadlines(), {tid: deadline})
    await harness.redis.hset(harness.keys.workflow(tid), "deadline_ms", deadline)


async def outage_ends_the_query_wait(harness: Harness, probe: SwitchedProbe,
                                     task: OpsTask) -> CommandPayload:
    """`task` asks the agent about its command, and the broker is down when that wait ends:
    the sweep fails nothing (it raises). Returns the query."""
    query = await overdue_with_query(harness, task)
    probe.down = True
    await query_wait_over(harness, task)
    with pytest.raises(InfrastructureUnavailable):
        await harness.executor.sweep_deadlines()
    return query


async def test_no_step_fails_while_the_broker_cannot_be_reached(
        harness: Harness, probe: SwitchedProbe) -> None:
    task = drain_offline(max_attempts=1)
    await outage_ends_the_query_wait(harness, probe, task)
    wf = await harness.wf(task)
    assert (wf.state, wf.step_state) == ("running", "started")
    assert await harness.redis.get(harness.keys.broker_outage()) is not None


async def test_a_wait_that_spanned_an_outage_starts_over_and_the_answer_still_counts(
        harness: Harness, probe: SwitchedProbe) -> None:
    task = drain_offline(max_attempts=1)
    query = await outage_ends_the_query_wait(harness, probe, task)
    drain = harness.commands()[0]
    probe.down = False
    await harness.executor.sweep_deadlines()
    wf = await harness.wf(task)
    assert (wf.state, wf.step_state, wf.query_id) == ("running", "started",
                                                       str(query.command_id))
    assert wf.deadline_ms == harness.clock.ms() + int(QUERY_TIMEOUT_S * 1000)
    assert "an outage is not a timeout" in harness.events(task)[-1].reason
    # The agent's answer to the query, once the broker delivers it, settles the step.
    await harness.answer(query, "succeeded", outputs={
        "queried_command_id": str(drain.command_id), "queried_action": "drain_node",
        "mode": "draining"})
    assert harness.last_command().action.action == "offline_node"


async def test_after_the_wait_that_spanned_it_an_outage_fails_nothing_more(
        harness: Harness, probe: SwitchedProbe) -> None:
    task = drain_offline(max_attempts=1)
    await outage_ends_the_query_wait(harness, probe, task)
    probe.down = False
    await harness.executor.sweep_deadlines()  # the wait starts over
    await query_wait_over(harness, task)
    await harness.executor.sweep_deadlines()  # no outage in this one: a timeout
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", "timeout")


async def test_an_outage_before_the_wait_began_excuses_nothing(
        harness: Harness, redis: Redis, keys: Keys) -> None:
    task = drain_offline(max_attempts=1)
    await overdue_with_query(harness, task)
    await BrokerHealth(redis, keys, lambda: harness.clock.now - timedelta(seconds=60)
                       ).note_outage()
    await query_wait_over(harness, task)
    await harness.executor.sweep_deadlines()
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", "timeout")


async def test_the_metadata_probe_reaches_the_real_broker(kafka_bootstrap: str) -> None:
    probe = MetadataProbe(ServiceSettings(kafka_bootstrap_servers=kafka_bootstrap))
    try:
        await probe()
        await probe()  # the client is kept between calls
    finally:
        await probe.close()


async def test_the_metadata_probe_fails_where_no_broker_listens() -> None:
    with socket.socket() as sock:  # a port nothing listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    probe = MetadataProbe(ServiceSettings(kafka_bootstrap_servers=f"127.0.0.1:{port}"))
    with pytest.raises(UNREACHABLE):
        await probe()
    await probe.close()
