"""docs/reliability.md S10 with a Redis of the test's own behind a proxy the test partitions,
and the real broker, service and agent processes: a node turns faulty while every service is
cut off from Redis. Automation fails closed: nothing is raised, dispatched or sent to the node
while the partition lasts, and no service dies of it. Once healed (the held traffic delivered,
or every connection reset, as after a failover), the task runs to success once and only the
faulty node is touched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent import fleet
from schemas.topics import Topic
from tests.chaos.harness import FLOW, NODES, TARGET, all_up, fault_env, stack_with_fleet
from tests.chaos.proxy import PartitionProxy
from tests.integration.harness import is_success_of, name, tap, task_events_for
from tests.integration.test_detection import needs_in
from tests.integration.test_executor_crash import journal_rows
from tests.integration.test_operator_control import UPKEEP_ACTIONS

PARTITION_S = 15.0  # under the collector's 30 s down grace: the heartbeat is not what is tested


def acted_on(state_dir: Path, node: str) -> list[tuple[str, str]]:
    return [(r[1], r[2]) for r in journal_rows(state_dir, node)
            if r[1] not in UPKEEP_ACTIONS | {"query_status"}]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("healed_by", ["delivering", "resetting"])
async def test_automation_fails_closed_while_redis_is_cut_off_and_resumes_once_after(
    kafka_bootstrap: str, partitionable_redis: tuple[str, PartitionProxy], namespace: str,
    tmp_path: Path, healed_by: str,
) -> None:
    direct_url, proxy = partitionable_redis
    env = fault_env(kafka_bootstrap, f"redis://127.0.0.1:{proxy.port}/0", namespace, tmp_path,
                    "")
    async with (stack_with_fleet(direct_url, namespace, tmp_path, env, FLOW),
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_NEEDS, namespace)) as watch):
        await all_up(watch)
        proxy.black_hole()
        await asyncio.sleep(2)  # what was in flight when it fell is held too
        mark = len(watch.records)
        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await asyncio.sleep(PARTITION_S)
        await watch.catch_up()
        during = watch.records[mark:]
        assert not [r for r in during if r.topic.endswith(Topic.OPS_NEEDS.value)], \
            "a need was raised without Redis"
        assert not [r for r in during if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)], \
            "a task moved without Redis"
        assert acted_on(tmp_path, TARGET) == []
        proxy.heal()
        if healed_by == "resetting":
            proxy.reset()
        await watch.wait_for(is_success_of(watch, TARGET), 150,
                             "the offline task to succeed once Redis is back")
        await watch.catch_up()
        events = task_events_for(watch, TARGET)
        final = [e for e in events if e.state in ("succeeded", "failed", "terminated")]
        assert [e.state for e in final] == ["succeeded"], [e.reason for e in events]
        assert [(n.kind, n.target) for n in needs_in(watch)] == [("offline", TARGET)]
    assert acted_on(tmp_path, TARGET) == [("drain_node", "succeeded"),
                                           ("offline_node", "succeeded")]
    for node in NODES:
        if node != TARGET:
            assert acted_on(tmp_path, node) == []
