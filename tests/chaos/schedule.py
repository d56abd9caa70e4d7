"""A randomized fault schedule and the invariants it is judged by (docs/reliability.md
§Randomized fault schedule).

For a set time, a seeded random schedule kills (kill -9) and restarts services, pauses them
(SIGSTOP, past their leases) and lets them go on, cuts Redis off and heals it, hangs the broker
and lets it go on, turns nodes faulty, and has an operator pause, resume and terminate the
tasks that run, while the pipeline does its work. Then everything is
healed, the pipeline is given time to finish, and the recorded history (the agents' journals
and every task event) must show: no task lost (each faulty node's task ended, once), nothing
disruptive done twice or to a healthy node, and no command accepted under an epoch older than
one its fence had already accepted. The seed is printed: `CHAOS_SEED=<seed>` repeats a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from uuid import UUID, uuid4

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from agent import fleet
from agent.journal import JOURNAL_FILE
from schemas.events.v1 import TaskControl, TaskEvent, now_utc
from schemas.topics import Topic, topic_name
from services.shared.redis_client import Keys
from services.shared.vouchers import ControlVouchers
from tests.chaos.conftest import PrivateBroker
from tests.chaos.proxy import PartitionProxy
from tests.integration.harness import Tap
from tests.integration.test_executor_crash import journal_rows
from warden import launcher

# Actions that change a node: each must happen at most once per node in a run (a node turns
# faulty once and is taken offline once), and never on a node that did not turn faulty.
DISRUPTIVE = frozenset({"drain_node", "offline_node", "migrate_job", "stop_job", "reboot_node",
                        "remove_node"})
FINAL = frozenset({"succeeded", "failed", "terminated"})


@dataclass
class Fault:
    """One step of the schedule, as it was done (the history the failures print)."""

    at_s: float
    what: str


OperatorAction = Literal["pause", "resume", "terminate"]
OPERATOR_ACTIONS: list[OperatorAction] = ["pause", "resume", "terminate"]


@dataclass
class Operator:
    """An operator at the API during the chaos: pauses, resumes and terminates tasks as they
    run. Each control goes the API's way (vouched for in Redis, then published); the API's own
    Redis link is not the one the schedule cuts."""

    producer: AIOKafkaProducer
    redis: Redis
    namespace: str
    watch: Tap
    paused: set[UUID] = field(default_factory=set)
    terminated: set[UUID] = field(default_factory=set)

    async def open_tasks(self) -> list[UUID]:
        await self.watch.catch_up()
        events = [TaskEvent.model_validate_json(r.value) for r in self.watch.records
                  if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]
        ended = {e.task_id for e in events if e.state in FINAL}
        return sorted({e.task_id for e in events} - ended)

    async def send(self, task_id: UUID, action: OperatorAction) -> None:
        control = TaskControl(event_id=uuid4(), source="chaos-operator", occurred_at=now_utc(),
                              cluster_id="itest", subject=str(task_id), task_id=task_id,
                              action=action, actor="chaos", reason="chaos schedule")
        await ControlVouchers(self.redis, Keys(self.namespace)).vouch(control)
        await self.producer.send_and_wait(topic_name(Topic.OPS_TASK_CONTROL, self.namespace),
                                          control.model_dump_json().encode(),
                                          key=str(task_id).encode())

    async def act(self, rng: random.Random) -> str | None:
        """A pause, a resume or (seldom) a terminate of a task still open; what it did."""
        tasks = await self.open_tasks()
        if not tasks:
            return None
        task_id = rng.choice(tasks)
        action: OperatorAction = rng.choices(OPERATOR_ACTIONS, weights=[4, 4, 1])[0]
        await self.send(task_id, action)
        if action == "pause":
            self.paused.add(task_id)
        elif action == "resume":
            self.paused.discard(task_id)
        else:
            self.terminated.add(task_id)
        return f"operator: {action} task {task_id}"

    async def resume_all(self) -> None:
        """The operator lets every task they paused go on (a paused task would never end)."""
        for task_id in sorted(self.paused - self.terminated):
            await self.send(task_id, "resume")
        self.paused.clear()


@dataclass
class Schedule:
    """The chaos of one run: what it may touch, and what it did."""

    rng: random.Random
    state_dir: Path
    env: dict[str, str]
    running: list[launcher.ServiceProcess]
    broker: PrivateBroker
    proxy: PartitionProxy
    nodes: Sequence[str]
    faulty_at_most: int
    operator: Operator | None = None
    history: list[Fault] = field(default_factory=list)
    faulty: list[str] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic)

    def note(self, what: str) -> None:
        self.history.append(Fault(round(time.monotonic() - self._started, 1), what))

    async def run(self, seconds: float) -> None:
        """Random faults, one every 2-5 s, for `seconds`; everything healed at the end."""
        steps: list[Callable[[], object]] = [self.kill_service, self.pause_service,
                                             self.cut_redis, self.hang_broker,
                                             self.fault_a_node]
        if self.operator is not None:
            steps += [self.operate, self.operate]
        deadline = time.monotonic() + seconds
        self.fault_a_node()  # there is always work in the pipeline while the faults come
        try:
            while time.monotonic() < deadline:
                step = self.rng.choice(steps)
                result = step()
                if asyncio.iscoroutine(result):
                    await result
                await asyncio.sleep(self.rng.uniform(2.0, 5.0))
        finally:
            self.heal()
        if self.operator is not None:
            await self.operator.resume_all()

    def _victim(self) -> launcher.ServiceProcess:
        return self.rng.choice([s for s in self.running if s.process.poll() is None])

    async def kill_service(self) -> None:
        victim = self._victim()
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(10)
        self.note(f"kill -9 {victim.name}")
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        index = self.running.index(victim)
        self.running[index] = launcher.start_services(self.state_dir, self.env,
                                                      (victim.name,))[0]
        self.note(f"restarted {victim.name}")

    async def pause_service(self) -> None:
        victim = self._victim()
        victim.process.send_signal(signal.SIGSTOP)
        pause = self.rng.uniform(2.0, 12.0)  # past the scheduler's 3 s lease, at times
        self.note(f"SIGSTOP {victim.name} for {pause:.1f} s")
        await asyncio.sleep(pause)
        victim.process.send_signal(signal.SIGCONT)

    async def cut_redis(self) -> None:
        cut = self.rng.uniform(2.0, 8.0)
        self.note(f"Redis cut off for {cut:.1f} s")
        self.proxy.black_hole()
        await asyncio.sleep(cut)
        self.proxy.heal()
        if self.rng.random() < 0.5:
            self.proxy.reset()
            self.note("Redis connections reset")

    async def hang_broker(self) -> None:
        hang = self.rng.uniform(2.0, 8.0)
        self.note(f"broker SIGSTOP for {hang:.1f} s")
        self.broker.pause()
        await asyncio.sleep(hang)
        self.broker.resume()

    async def operate(self) -> None:
        assert self.operator is not None
        if (did := await self.operator.act(self.rng)) is not None:
            self.note(did)

    def fault_a_node(self) -> None:
        healthy = [n for n in self.nodes if n not in self.faulty]
        if len(self.faulty) >= self.faulty_at_most or not healthy:
            return
        node = self.rng.choice(healthy)
        fleet.inject_fault(self.state_dir, node, xid=[79])
        self.faulty.append(node)
        self.note(f"XID 79 on {node}")

    def heal(self) -> None:
        """Everything back: no pause, no cut, the broker running, every service alive."""
        self.proxy.heal()
        self.broker.resume()
        for index, svc in enumerate(self.running):
            if svc.process.poll() is None:
                svc.process.send_signal(signal.SIGCONT)
            else:
                self.running[index] = launcher.start_services(self.state_dir, self.env,
                                                              (svc.name,))[0]


def node_epochs(state_dir: Path, node: str) -> list[int]:
    """The epochs of the node-fenced commands the agent accepted, in the order it did."""
    path = fleet.agent_dir(state_dir, node) / JOURNAL_FILE
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [int(r[0]) for r in db.execute(
            "SELECT epoch FROM commands WHERE epoch IS NOT NULL AND outcome != 'rejected'"
            " AND action NOT LIKE '%_job' ORDER BY recorded_at, rowid")]
    finally:
        db.close()


def violations(state_dir: Path, nodes: Sequence[str], faulty: Sequence[str],
               events: Sequence[TaskEvent], terminated: frozenset[UUID] = frozenset(),
               ) -> list[str]:
    """Every invariant the recorded history breaks (none: the run passed). A faulty node
    whose every task an operator terminated need not have one that succeeded."""
    found: list[str] = []
    for node in nodes:
        rows = journal_rows(state_dir, node)
        # A job action acts on its job: two jobs moved off a node are two moves, not one twice.
        executed = Counter(
            f"{action} {json.loads(result).get('outputs', {}).get('job_id', '')}".strip()
            for _, action, outcome, _, result in rows
            if action in DISRUPTIVE and outcome == "succeeded")
        twice = {action: n for action, n in executed.items() if n > 1}
        if twice:
            found.append(f"{node}: done more than once: {twice}")
        if node not in faulty and executed:
            found.append(f"{node} was never faulty and had {dict(executed)}")
        epochs = node_epochs(state_dir, node)
        if epochs != sorted(epochs):
            found.append(f"{node} accepted a node command under an older epoch: {epochs}")
    tasks: dict[str, list[TaskEvent]] = {}
    for event in events:
        tasks.setdefault(str(event.task_id), []).append(event)
    targets = {str(e.task.task_id): e.task.target for e in events if e.task is not None}
    for task_id, history in tasks.items():
        finals = {e.event_id: e.state for e in history if e.state in FINAL}
        if len(set(finals.values())) > 1:
            found.append(f"task {task_id} ended in more than one way: {sorted(finals.values())}")
        if not finals:
            found.append(f"task {task_id} ({targets.get(task_id)}) never ended: last "
                         f"{history[-1].state} {history[-1].reason!r}")
    for node in faulty:
        own = [t for t, target in targets.items() if target == node]
        succeeded = [t for t in own if any(e.state == "succeeded" for e in tasks.get(t, []))]
        if not own:
            found.append(f"{node} turned faulty and no task was made for it")
        elif not succeeded and not all(UUID(t) in terminated for t in own):
            found.append(f"{node} turned faulty and no task of it succeeded")
    return found
