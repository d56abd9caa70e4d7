"""The randomized fault schedule (tests/chaos/schedule.py) on a broker and a Redis of the test's
own, the real service processes and four agents: for CHAOS_SCHEDULE_S seconds (45 here; the
benchmark `python -m bench.chaos_schedule` runs minutes) services are killed and paused, Redis
is cut off, the broker hangs, nodes turn faulty and an operator pauses, resumes and terminates
tasks, at random from CHAOS_SEED (fixed here, so
`make test` replays one schedule; a seed of its own per run from the benchmark). Then, healed,
the recorded history must break no invariant."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from schemas.events.v1 import TaskEvent
from schemas.topics import Topic
from services.shared.redis_client import connect_redis
from tests.chaos.conftest import PrivateBroker
from tests.chaos.harness import FLOW, all_up, fault_env, stack_with_fleet
from tests.chaos.proxy import PartitionProxy
from tests.chaos.schedule import FINAL, Operator, Schedule, violations
from tests.integration.harness import name, producer, tap, until

NODES = [f"node-00{i}" for i in range(1, 5)]
SECONDS = float(os.environ.get("CHAOS_SCHEDULE_S", "45"))
SEED = int(os.environ.get("CHAOS_SEED", "20261205"))


@pytest.mark.timeout(int(SECONDS) + 480)
async def test_a_random_fault_schedule_breaks_no_invariant(
    private_kafka: PrivateBroker, partitionable_redis: tuple[str, PartitionProxy],
    namespace: str, tmp_path: Path,
) -> None:
    direct_url, proxy = partitionable_redis
    direct = connect_redis(direct_url)  # the operator's (the API's) link, never cut
    env = fault_env(private_kafka.bootstrap, f"redis://127.0.0.1:{proxy.port}/0", namespace,
                    tmp_path, "")
    env |= {"SCHEDULER_LEASE_S": "3",
            # Simulated jobs: a faulty node's task moves them (child tasks), so there is work
            # in flight for the faults to meet.
            "AGENT_JOBS": "sim",
            # Two of four nodes may turn faulty: both may go offline, nothing else holds them.
            "SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION": "0.9",
            "SCHEDULER_OFFLINE_BUDGET_FRACTION": "1.0"}
    print(f"chaos schedule: CHAOS_SEED={SEED} CHAOS_SCHEDULE_S={SECONDS:g}")
    async with (stack_with_fleet(direct_url, namespace, tmp_path, env, FLOW,
                                 nodes=NODES) as running,
                tap(private_kafka.bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                    name(Topic.OPS_NODE_STATE, namespace)) as watch,
                producer(private_kafka.bootstrap) as prod):
        await all_up(watch, NODES)
        operator = Operator(prod, direct, namespace, watch)
        schedule = Schedule(random.Random(SEED), tmp_path, env, running, private_kafka, proxy,
                            NODES, faulty_at_most=2, operator=operator)
        await schedule.run(SECONDS)
        schedule.note("healed")

        def events() -> list[TaskEvent]:
            return [TaskEvent.model_validate_json(r.value) for r in watch.records
                    if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]

        async def settled() -> bool:
            await watch.catch_up()
            targets = {e.task.target for e in events() if e.task is not None}
            ended = {str(e.task_id) for e in events() if e.state in FINAL}
            return (set(schedule.faulty) <= targets
                    and {str(e.task_id) for e in events()} <= ended)

        history = "\n".join(f"{f.at_s:>6} s  {f.what}" for f in schedule.history)
        await until(settled, 300, lambda: f"every task to end (seed {SEED}):\n{history}")
        print(history)
        broken = violations(tmp_path, NODES, schedule.faulty, events(),
                            frozenset(operator.terminated))
        assert not broken, f"seed {SEED}:\n" + "\n".join(broken) + f"\n{history}"
    await direct.aclose()
