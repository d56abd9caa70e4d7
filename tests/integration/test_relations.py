"""Template relations on the real broker, Redis, task store and agent processes: a template's
concurrency, exclusive_with, depends_on and concurrent_with each hold a real task back (the
reason in its transitions) and then release it, or let it run.

Needs are raised as the analyzer raises them and the real templater plans them with test
templates (TEMPLATER_TEMPLATE_DIR). A task is kept running by its node ignoring commands: its
drain gets no answer until the node listens again, when the executor's deadline asks the node,
learns the command never arrived and sends it again, and the task succeeds. A node that fails
drains makes its task fail instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
import yaml
from aiokafka import AIOKafkaProducer

from agent import fleet
from common.signing import ensure_signer_keys
from schemas.events.v1 import NeedKind, OpsNeed, TaskEvent, now_utc
from schemas.topics import Topic
from services.store.db import open_store
from services.store.queries import get_task
from tests.contracts.examples import example
from tests.integration import harness
from tests.integration.harness import Record, Tap

NODES = ["node-001", "node-002", "node-003"]
# Long enough for the other task to be queued and held while the drain waits; the node
# listens again before it ends.
DRAIN_S = 30
pytestmark = pytest.mark.timeout(420)


def template(name: str, need: NeedKind, **fields: Any) -> dict[str, Any]:
    """A test template: drain the target, then undrain it (the node is left as found)."""
    return {
        "name": name, "version": 1, "need": need, "description": f"{name} (test)",
        "priority": 3, "mutex": ["node.{cluster}.{target}"], "execution_count": 1,
        "retry": {"max_attempts": 1},
        "steps": [
            {"name": "drain", "action": "drain_node", "args": {"node_id": "{target}"},
             "timeout_s": DRAIN_S},
            {"name": "undrain", "action": "undrain_node", "args": {"node_id": "{target}"}},
        ],
        **fields,
    }


@dataclass
class Stack:
    """The running services and fleet of one test, and a tap on the task events."""

    prod: AIOKafkaProducer
    watch: Tap
    namespace: str
    state: Path

    async def raise_need(self, kind: NeedKind, target: str, pool: str = "default") -> None:
        need = example("ops_need", OpsNeed).model_copy(update={
            "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": "itest",
            "subject": target, "target": target, "pool": pool, "kind": kind})
        await self.prod.send_and_wait(harness.name(Topic.OPS_NEEDS, self.namespace),
                                      need.model_dump_json().encode(), key=target.encode())

    def events(self) -> list[TaskEvent]:
        return [TaskEvent.model_validate_json(r.value) for r in self.watch.records
                if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]

    def task_of(self, target: str) -> UUID | None:
        """The latest task aimed at `target`."""
        made = [e.task_id for e in self.events() if e.task is not None
                and e.task.target == target]
        return made[-1] if made else None

    def trail(self, task_id: UUID) -> list[TaskEvent]:
        return [e for e in self.events() if e.task_id == task_id]

    async def wait(self, target: str, check: Callable[[list[TaskEvent]], bool],
                   what: str, timeout_s: float = 120) -> UUID:
        """Wait until the transitions of `target`'s task satisfy `check`; its id."""
        def done(_: Record) -> bool:
            task_id = self.task_of(target)
            return task_id is not None and check(self.trail(task_id))
        await self.watch.wait_for(done, timeout_s, f"{target}'s task: {what}")
        task_id = self.task_of(target)
        assert task_id is not None
        return task_id

    async def running(self, target: str) -> UUID:
        return await self.wait(target, lambda t: any(
            e.step_index == 0 and e.step_state == "started" for e in t), "its drain started")

    async def held(self, target: str, reason: str) -> UUID:
        return await self.wait(target, lambda t: any(
            e.state == e.previous_state == "queued" and e.reason.startswith(f"held: {reason}")
            for e in t), f"held ({reason})")

    async def ended(self, target: str, state: str = "succeeded") -> UUID:
        return await self.wait(target, lambda t: any(
            e.state == state and e.step_state is None for e in t), state, DRAIN_S + 120)

    def at(self, task_id: UUID, check: Callable[[TaskEvent], bool]) -> TaskEvent:
        return next(e for e in self.trail(task_id) if check(e))


def dispatched(e: TaskEvent) -> bool:
    return e.state == "dispatched"


def final(e: TaskEvent) -> bool:
    return e.state in ("succeeded", "failed") and e.step_state is None


@asynccontextmanager
async def stack(kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path,
                templates: list[dict[str, Any]]) -> AsyncIterator[Stack]:
    directory = tmp_path / "templates"
    directory.mkdir()
    for t in templates:
        (directory / f"{t['name']}.yaml").write_text(yaml.safe_dump(t, sort_keys=False))
    env = harness.stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        AGENT_JOBS="", TEMPLATER_TEMPLATE_DIR=str(directory),
        DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}",
        # Nodes that ignore commands must not fail the centre's probes meanwhile.
        COLLECTOR_PROBE_PERIOD_S="3600", EXECUTOR_STATUS_QUERY_TIMEOUT_S="5",
        # No analyzer runs, so no pool health: only the relations may hold these tasks.
        SCHEDULER_BREAKER_DISRUPTIVE_KINDS="[]", SCHEDULER_BUDGET_KINDS="[]",
        SCHEDULER_RATE_LIMITED_KINDS="[]",
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    names = ("collector", "templater", "scheduler", "executor", "store")
    async with harness.services(env, tmp_path, names), harness.watched_fleet(
            env, tmp_path, trusted, [Topic.OPS_TASK_EVENTS, Topic.OPS_NODE_STATE],
            len(NODES)) as watch, harness.producer(kafka_bootstrap) as prod:
        for node in NODES:
            await watch.wait_for(harness.is_up(node), 90, f"{node} up")
        yield Stack(prod, watch, namespace, tmp_path)


def deaf(state: Path, node: str, on: bool = True) -> None:
    fleet.inject_fault(state, node, ignore_commands=on)


async def test_concurrency_one_holds_the_second_task_until_the_first_ends(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    async with stack(kafka_bootstrap, redis_url, namespace, tmp_path,
                     [template("solo", "online", concurrency=1)]) as s:
        deaf(tmp_path, "node-001")
        await s.raise_need("online", "node-001")
        first = await s.running("node-001")
        await s.raise_need("online", "node-002")
        second = await s.held("node-002", "concurrency: 1 of 1 solo task(s) run on itest")
        assert not any(dispatched(e) for e in s.trail(second))
        deaf(tmp_path, "node-001", on=False)
        await s.ended("node-001")
        await s.ended("node-002")
        # Released only once the first had ended.
        assert s.at(second, dispatched).occurred_at >= s.at(first, final).occurred_at

        # The task record has the hold and the execution count of the plan.
        store = open_store(f"sqlite+aiosqlite:///{tmp_path / 'warden.db'}")
        try:
            async with store.session() as session:
                record = await get_task(session, second)
        finally:
            await store.close()
        assert record is not None
        assert record.plan is not None
        assert record.plan["execution_count"] == 1
        assert [st["execution_count"] for st in record.plan["steps"]] == [1, 1]
        assert any(t.reason.startswith("held: concurrency") for t in record.transitions)


async def test_exclusive_with_holds_a_task_while_the_other_runs(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    # Different pools, so the default exclusion on a pool holds nothing: the relation does.
    async with stack(kafka_bootstrap, redis_url, namespace, tmp_path, [
            template("firmware", "online"),
            template("rebalance", "scale_out", relations={"exclusive_with": ["online"]}),
    ]) as s:
        deaf(tmp_path, "node-001")
        await s.raise_need("online", "node-001", pool="p1")
        first = await s.running("node-001")
        await s.raise_need("scale_out", "node-002", pool="p2")
        second = await s.held("node-002", f"exclusive_with firmware in the cluster: task "
                                          f"{first} (firmware) runs")
        deaf(tmp_path, "node-001", on=False)
        await s.ended("node-001")
        await s.ended("node-002")
        assert s.at(second, dispatched).occurred_at >= s.at(first, final).occurred_at


async def test_depends_on_waits_then_proceeds_or_fails_with_the_other(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    async with stack(kafka_bootstrap, redis_url, namespace, tmp_path, [
            template("check", "online"),
            template("after", "scale_out", relations={"concurrent_with": ["check"]},
                     depends_on=[{"template": "check", "on_failure": "fail"}]),
    ]) as s:
        # ---- the other succeeds: the dependent waits, then runs ------------------------
        deaf(tmp_path, "node-001")
        await s.raise_need("online", "node-001")
        check = await s.running("node-001")
        await s.raise_need("scale_out", "node-002")
        after = await s.held("node-002", f"depends_on check: waits for task {check} to "
                                         "finish")
        deaf(tmp_path, "node-001", on=False)
        await s.ended("node-001")
        await s.ended("node-002")
        assert s.at(after, dispatched).occurred_at >= s.at(check, final).occurred_at

        # ---- the other fails: the dependent fails without running, the other named -----
        deaf(tmp_path, "node-003")
        await s.raise_need("online", "node-003")
        failing = await s.running("node-003")
        await s.raise_need("scale_out", "node-001")
        doomed = await s.held("node-001", f"depends_on check: waits for task {failing}")
        # The node answers again, and fails the drain sent again at the deadline.
        fleet.inject_fault(tmp_path, "node-003", ignore_commands=False,
                           fail_actions=["drain_node"])
        await s.ended("node-003", "failed")
        await s.ended("node-001", "failed")
        failed = s.at(doomed, final)
        assert (failed.previous_state, failed.actor) == ("queued", "scheduler")
        assert failed.reason == f"depends_on check: task {failing} failed"
        assert not any(dispatched(e) for e in s.trail(doomed))


async def test_concurrent_with_lets_two_tasks_of_one_pool_overlap(
        kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
    async with stack(kafka_bootstrap, redis_url, namespace, tmp_path, [
            template("long", "online"),
            template("friend", "scale_out", relations={"concurrent_with": ["online"]}),
            template("stranger", "load_balance"),
    ]) as s:
        deaf(tmp_path, "node-001")
        await s.raise_need("online", "node-001")
        first = await s.running("node-001")
        # Same pool: the friend runs and ends while the first still runs; the stranger,
        # concurrent with neither, is held by the default exclusion until the first ends.
        await s.raise_need("scale_out", "node-002")
        await s.raise_need("load_balance", "node-003")
        friend = await s.ended("node-002")
        stranger = await s.held("node-003", f"task {first} (long) runs on pool default, "
                                            "and neither template is concurrent_with the other")
        assert not any(final(e) for e in s.trail(first))
        assert not any(dispatched(e) for e in s.trail(stranger))
        deaf(tmp_path, "node-001", on=False)
        await s.ended("node-001")
        await s.ended("node-003")
        assert s.at(friend, final).occurred_at <= s.at(first, final).occurred_at
        assert s.at(stranger, dispatched).occurred_at >= s.at(first, final).occurred_at
