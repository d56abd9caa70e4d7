"""Remediation time: from a GPU fault on a node running a training job to that job training
again on another node, and the progress lost on the way.

One fleet of real agent processes (`python -m agent`, one real training job each) against
every service on the real broker and Redis. Faults are injected one node at a time, at a
random moment of the report interval: an XID 79 (GPU fallen off the bus). The offline task
drains the node and takes it offline (its job checkpoints as it stops), then moves the job
to the least busy node (a child task: migrate_job out with the checkpoint, start_job in from
it). Measured per fault, with this machine's wall clock:

* fault -> job running elsewhere: until the job's status file on the new node says it
  trains (status files are written every second, so figures are up to ~1 s late);
* steps lost: the last step the old node's status file showed minus the step the job
  resumed from (0 or less: nothing was lost, the stop checkpointed after it);
* the phases from the task's events: detection (fault -> task created), offline (-> the
  offline step completed), migration (-> the child task succeeded).

Run: `python -m bench.remediation` (see --help); figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypedDict
from uuid import UUID, uuid4

from aiokafka import AIOKafkaConsumer

from agent import fleet
from agent.jobs.processes import job_dir
from agent.ml.runtime import STATUS_FILE
from bench.common import Spread, exit_cleanly_on_sigterm, spread
from common.messaging import ensure_topics
from common.signing import ensure_signer_keys
from schemas.events.v1 import OutputValue, TaskEvent
from schemas.topics import Topic, topic_name
from services.shared.registry import register
from warden import launcher


def status(state: Path, node: str, job: str) -> dict[str, Any]:
    """A job's latest status file on `node` ({} if none)."""
    path = job_dir(fleet.agent_dir(state, node), job) / STATUS_FILE
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class TrialResult(TypedDict):
    """One fault: where the job went, how long each stage took (s) and the steps it lost."""

    victim: str
    destination: str
    fault_to_running_s: float | None
    detect_s: float | None
    offline_s: float | None
    migrated_s: float | None
    last_step_seen: int
    resumed_step: OutputValue | None
    steps_lost: int | None


class Summary(TypedDict):
    trials: int
    job_running_again: int
    fault_to_running_s: Spread
    detect_s: Spread
    offline_s: Spread
    migrated_s: Spread
    steps_lost: Spread


class Events:
    """Every task event of the run, read in the background."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.events: list[tuple[float, TaskEvent]] = []

    async def pump(self) -> None:
        while True:
            for records in (await self.consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    event = TaskEvent.model_validate_json(record.value)
                    self.events.append((record.timestamp / 1000.0, event))

    def for_target(self, target: str) -> tuple[list[tuple[float, TaskEvent]],
                                               list[tuple[float, TaskEvent]]]:
        """The (broker time, event) pairs of the task aimed at `target` and of its children."""
        parents: set[UUID] = {e.task_id for _, e in self.events
                              if e.task is not None and e.task.target == target
                              and e.task.parent_task_id is None}
        children = {e.task_id for _, e in self.events
                    if e.task is not None and e.task.parent_task_id in parents}
        return ([(t, e) for t, e in self.events if e.task_id in parents],
                [(t, e) for t, e in self.events if e.task_id in children])


async def trial(state: Path, events: Events, victim: str, nodes: list[str],
                interval: float, rng: random.Random) -> TrialResult:
    job = f"{victim}.train"
    await asyncio.sleep(rng.uniform(0.0, interval))
    injected = time.time()
    fleet.inject_fault(state, victim, xid=[79])
    last_step_here = int(status(state, victim, job).get("step", -1))
    running_at: float | None = None
    destination = ""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and running_at is None:
        # Until the job left, its status here is the progress it would lose.
        here = status(state, victim, job)
        if here.get("state") == "running":
            last_step_here = max(last_step_here, int(here.get("step", -1)))
        for node in nodes:
            there = status(state, node, job) if node != victim else {}
            if there.get("state") == "running" and there.get("pid") != here.get("pid"):
                running_at, destination = time.time(), node
                break
        await asyncio.sleep(0.1)
    await asyncio.sleep(2.0)  # the child task's last events
    parent, children = events.for_target(victim)
    created = next((t for t, e in parent if e.state == "created"), None)
    offline_done = next((t for t, e in parent if e.step_index == 1
                         and e.step_state == "completed"), None)
    child_done = next((t for t, e in children if e.state == "succeeded"), None)
    resumed = next((e.outputs.get("resumed_step") for _, e in children
                    if e.step_state == "completed" and "resumed_step" in e.outputs), None)
    return {
        "victim": victim, "destination": destination,
        "fault_to_running_s": None if running_at is None else round(running_at - injected, 2),
        "detect_s": None if created is None else round(created - injected, 2),
        "offline_s": None if offline_done is None else round(offline_done - injected, 2),
        "migrated_s": None if child_done is None else round(child_done - injected, 2),
        "last_step_seen": last_step_here,
        "resumed_step": resumed,
        "steps_lost": (None if not isinstance(resumed, int)
                       else max(0, last_step_here - resumed)),
    }


async def run(trials: int, spare: int, interval: float, bootstrap: str,
              redis_url: str) -> list[TrialResult]:
    namespace = f"rem{uuid4().hex[:8]}"
    state = Path(tempfile.mkdtemp(prefix="cw-remediation-"))
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
        "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": "bench",
        "WARDEN_STATE_DIR": str(state),
        "WARDEN_LOG_LEVEL": os.environ.get("WARDEN_LOG_LEVEL", "WARNING"),
        "AGENT_JOBS": "train",
        # Only the fault need, and a pool this small may lose most of its nodes to the
        # trials: the safety limits made for large pools would stop the run half way.
        "ANALYZER_ENABLED_NEEDS": '["offline"]',
        "CAPACITY_PROVIDER": "none",
        "SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION": "0.95",
        "SCHEDULER_OFFLINE_BUDGET_FRACTION": "1.0",
        "SCHEDULER_RATE_PER_S": "10",
    }
    await ensure_topics(bootstrap, namespace)
    trusted = ensure_signer_keys(state / "keys")
    services = launcher.start_services(state, env)
    count = trials + spare
    agents = fleet.fleet_up(count, 1, "bench", namespace, state, env, trusted, interval)
    nodes = [a.node_id for a in agents]
    await register(redis_url, namespace, "bench", nodes)
    consumer = AIOKafkaConsumer(topic_name(Topic.OPS_TASK_EVENTS, namespace),
                                bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    events = Events(consumer)
    pump = asyncio.create_task(events.pump())
    results: list[TrialResult] = []
    try:
        # Every job trains before the first fault.
        deadline = time.monotonic() + 120
        # Status files have no event to await: they are polled.
        while time.monotonic() < deadline and not all(  # noqa: ASYNC110
                int(status(state, n, f"{n}.train").get("step", 0)) > 0 for n in nodes):
            await asyncio.sleep(0.5)
        rng = random.Random(11)
        for victim in nodes[:trials]:
            await asyncio.sleep(3.0)  # let checkpoints age like in a real run
            result = await trial(state, events, victim, nodes, interval, rng)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        pump.cancel()
        await consumer.stop()
        fleet.fleet_down(state)
        launcher.stop_services(services)
    return results


StageKey = Literal["fault_to_running_s", "detect_s", "offline_s", "migrated_s", "steps_lost"]


def summary(results: list[TrialResult]) -> Summary:
    def stats(key: StageKey) -> Spread:
        return spread(float(v) for r in results if (v := r[key]) is not None)

    return {
        "trials": len(results),
        "job_running_again": sum(r["fault_to_running_s"] is not None for r in results),
        "fault_to_running_s": stats("fault_to_running_s"),
        "detect_s": stats("detect_s"), "offline_s": stats("offline_s"),
        "migrated_s": stats("migrated_s"), "steps_lost": stats("steps_lost"),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5, help="Faults (one node each).")
    parser.add_argument("--spare", type=int, default=2, help="Nodes never faulted.")
    parser.add_argument("--interval", type=float, default=2.0, help="Report interval, s.")
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    print(f"# remediation, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores), {args.trials + args.spare} nodes with one training "
          f"job each, report interval {args.interval}s")
    results = await run(args.trials, args.spare, args.interval, bootstrap, redis_url)
    print(json.dumps(summary(results)))


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
