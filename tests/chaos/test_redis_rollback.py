"""docs/reliability.md S11 on a Redis of the test's own, with the real broker, service and agent
processes: Redis loses everything since a snapshot (as after a lost fsync, or a failover to a
replica that lagged). The snapshot is taken while every node is up; then a faulty node is
drained and taken offline, Redis is killed and started again from the snapshot, and the node
is repaired. Nothing done before the rollback is done again, and the node comes back online:
the fencing epoch and the node's command seqs the centre issues after the rollback are still
newer than those the agent accepted before it (they never go back with Redis' state)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent import fleet
from schemas.topics import Topic
from tests.chaos.conftest import RestartableRedis
from tests.chaos.harness import FLOW, TARGET, all_up, fault_env, stack_with_fleet
from tests.chaos.test_redis_partition import acted_on
from tests.integration.harness import a_need, name, tap, task_events_for


@pytest.mark.timeout(400)
async def test_after_redis_loses_its_recent_state_nothing_is_redone_and_a_repair_goes_through(
    kafka_bootstrap: str, restartable_redis: RestartableRedis, namespace: str, tmp_path: Path
) -> None:
    env = fault_env(kafka_bootstrap, restartable_redis.url, namespace, tmp_path, "")
    env |= {"ANALYZER_ENABLED_NEEDS": '["offline", "online"]', "ANALYZER_ONLINE__HOLD_S": "5"}
    snapshot = tmp_path / "t0.rdb"
    async with (stack_with_fleet(restartable_redis.url, namespace, tmp_path, env,
                                 FLOW),
                tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace),
                    name(Topic.OPS_NEEDS, namespace)) as watch):
        await all_up(watch)
        restartable_redis.save()
        shutil.copy(restartable_redis.dump, snapshot)

        fleet.inject_fault(tmp_path, TARGET, xid=[79])
        await watch.wait_for(lambda r: r.key == TARGET.encode()
                             and b'"state":"offline"' in r.value, 120, f"{TARGET} offline")
        assert acted_on(tmp_path, TARGET) == [("drain_node", "succeeded"),
                                               ("offline_node", "succeeded")]

        # Everything since the snapshot is lost.
        restartable_redis.kill()
        shutil.copy(snapshot, restartable_redis.dump)
        restartable_redis.start()

        mark = len(watch.records)
        fleet.clear_faults(tmp_path, TARGET)
        await watch.wait_for(a_need("online", TARGET), 120, "an online need", start=mark)

        def brought_online(_: object) -> bool:
            return any(e.state in ("succeeded", "failed") and e.task is None
                       and any(t.task is not None and t.task.need_kind == "online"
                               and t.task_id == e.task_id
                               for t in task_events_for(watch, TARGET))
                       for e in task_events_for(watch, TARGET))

        await watch.wait_for(brought_online, 150, "the online task to end")
        events = task_events_for(watch, TARGET)
        online = {e.task_id for e in events if e.task is not None and e.task.need_kind == "online"}
        ends = [(e.state, e.reason) for e in events
                if e.task_id in online and e.state in ("succeeded", "failed")]
        assert [state for state, _ in ends] == ["succeeded"], ends
    assert acted_on(tmp_path, TARGET) == [("drain_node", "succeeded"),
                                           ("offline_node", "succeeded"),
                                           ("online_node", "succeeded")]
