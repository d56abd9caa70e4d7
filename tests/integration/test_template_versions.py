"""Template versions live, end to end on the real broker, Redis and PostgreSQL: an API edit
and a rollback reach a running templater without a restart (its periodic re-read is set far
beyond the test, so only the change event can have done it), and the tuner, fed reports whose
jobs deliver twice the throughput per node, makes a tuned scale_out version that the next
task runs with, once the template is unpinned (a pinned one is left alone)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from uuid import uuid4

import pytest
from pydantic import SecretStr

from schemas.events.v1 import JobInfo, NodeReport, OpsNeed, OpsTask, now_utc
from schemas.topics import Topic
from services.api.settings import ApiSettings
from services.shared.registry import register
from services.store.db import migrate, open_store
from services.store.template_versions import history
from services.templater.templates import TEMPLATE_DIR
from tests.contracts.examples import example
from tests.integration.harness import (
    Tap,
    name,
    producer,
    services,
    signed,
    stack_env,
    tap,
    until,
)
from tests.service.api.conftest import Api, auth, start, token_setting

CLUSTER = "itest"
POOL = "default"
NODES = ("node-001", "node-002")
# Only the change event can make the templater reload within a test.
NO_PERIODIC_RELOAD = {"TEMPLATER_RELOAD_INTERVAL_S": "3600"}
LB = (TEMPLATE_DIR / "load_balance.yaml").read_text()
# The built-in scale_out, opted in: two nodes per scale-out, which one scale-out's 200
# units of throughput imply nodes deliver 100 each.
TUNABLE_SCALE_OUT = (TEMPLATE_DIR / "scale_out.yaml").read_text().replace(
    "  rebalance_max_jobs: 8\n", "  rebalance_max_jobs: 8\n  nodes_per_scale_out: 2\n"
).replace('nodes: 0}', 'nodes: "{nodes_per_scale_out}"}') + (
    "tuning: {parameter: nodes_per_scale_out, capacity_per_task: 200, "
    "drift_threshold: 0.25, min_samples: 6, min_value: 1, max_value: 16}\n")
pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def need(kind: str, target: str) -> OpsNeed:
    golden = example("ops_need", OpsNeed)
    return golden.model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": CLUSTER, "kind": kind,
        "target": target, "subject": target, "pool": POOL})


def report(node: str, seq: int, throughput: float) -> NodeReport:
    golden = example("node_report", NodeReport)
    gpus = [g.model_copy(update={"xid_events": []}) for g in golden.gpus]
    job = JobInfo(job_id=f"{node}.train", kind="training", state="running",
                  throughput=throughput, gpu_indices=[0])
    return golden.model_copy(update={
        "event_id": uuid4(), "occurred_at": now_utc(), "cluster_id": CLUSTER, "node_id": node,
        "subject": node, "pool": POOL, "seq": seq, "faults": [], "gpus": gpus, "jobs": [job]})


def task_for(watch: Tap, sent: OpsNeed) -> OpsTask | None:
    for record in watch.records:
        if record.topic.endswith(Topic.OPS_TASKS.value):
            task = OpsTask.model_validate_json(record.value)
            if task.need_id == sent.event_id:
                return task
    return None


async def planned(watch: Tap, sent: OpsNeed, bootstrap: str, namespace: str) -> OpsTask:
    async with producer(bootstrap) as prod:
        await prod.send_and_wait(name(Topic.OPS_NEEDS, namespace),
                                 sent.model_dump_json().encode(), key=sent.target.encode())
    await watch.wait_for(lambda _: task_for(watch, sent) is not None, 90,
                         f"the task of need {sent.kind}")
    task = task_for(watch, sent)
    assert task is not None
    return task


async def loaded(state: Path, label: str) -> None:
    """Until the running templater says it loaded `label` (the change reaches it as an event,
    apart from the needs: a need sent at the same moment may still meet the version before)."""
    log = state / "logs" / "templater.log"

    def seen() -> bool:
        return any("templates loaded" in line and label in line
                   for line in log.read_text(errors="replace").splitlines())

    await until(seen, 60, f"the templater to load {label}")


@asynccontextmanager
async def api_on(kafka_bootstrap: str, redis_url: str, namespace: str, database_url: str,
                 tmp_path: Path) -> AsyncIterator[Api]:
    settings = ApiSettings(
        kafka_bootstrap_servers=kafka_bootstrap, redis_url=redis_url, namespace=namespace,
        cluster_id=CLUSTER, state_dir=str(tmp_path / "api"), database_url=database_url,
        tokens=SecretStr(token_setting()), publish_timeout_s=20.0)
    async for running in start(settings):
        yield running


async def test_an_api_edit_and_a_rollback_reach_the_running_templater(
        kafka_bootstrap: str, redis_url: str, namespace: str, database_url: str,
        tmp_path: Path) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, DATABASE_URL=database_url,
                    **NO_PERIODIC_RELOAD)
    async with services(env, tmp_path, ("templater",)), \
            api_on(kafka_bootstrap, redis_url, namespace, database_url, tmp_path) as api, \
            tap(kafka_bootstrap, name(Topic.OPS_TASKS, namespace)) as watch:
        first = await planned(watch, need("load_balance", "node-002"), kafka_bootstrap,
                              namespace)
        assert first.template == "load_balance.v1"

        edited = LB.replace("jobs_per_run: 1", "jobs_per_run: 2")
        saved = await api.put("/api/templates/load_balance",
                              {"yaml": edited, "reason": "two jobs per run"})
        assert saved.json()["version"] == 2, saved.text
        await loaded(tmp_path, "load_balance.v2")
        second = await planned(watch, need("load_balance", "node-002"), kafka_bootstrap,
                               namespace)
        assert second.template == "load_balance.v2"
        assert second.steps[0].action.max_jobs == 2  # type: ignore[union-attr]

        rolled = await api.post("/api/templates/load_balance/rollback",
                                {"version": 1, "reason": "two moved too much"}, role="admin")
        assert (rolled.json()["version"], rolled.json()["origin"]) == (3, "rollback")
        await loaded(tmp_path, "load_balance.v3")
        third = await planned(watch, need("load_balance", "node-002"), kafka_bootstrap,
                              namespace)
        assert third.template == "load_balance.v3"
        assert third.steps[0].action.max_jobs == 1  # type: ignore[union-attr]

        listed = (await api.get("/api/templates/load_balance/history")).json()
        assert [(v["version"], v["origin"]) for v in listed["versions"]] == [
            (3, "rollback"), (2, "manual"), (1, "builtin")]
        diff = (await api.client.get("/api/templates/load_balance/diff",
                                     params={"from": 1, "to": 3},
                                     headers=auth("viewer"))).json()["diff"]
        # A rollback's text is the old one but for its version line.
        assert "-version: 1\n+version: 3\n" in diff
        assert "jobs_per_run" not in diff


async def feed(bootstrap: str, namespace: str, state: Path, start_seq: int, rounds: int,
               throughput: float) -> int:
    async with producer(bootstrap) as prod:
        seq = start_seq
        for _ in range(rounds):
            seq += 1
            for node in NODES:
                body, mac = signed(report(node, seq, throughput), state)
                await prod.send_and_wait(name(Topic.NODE_REPORTS, namespace), body,
                                         key=node.encode(), headers=mac)
    return seq


async def test_the_tuner_halves_the_scale_out_step_once_nodes_deliver_twice_as_much(
        kafka_bootstrap: str, redis_url: str, namespace: str, database_url: str,
        tmp_path: Path) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, DATABASE_URL=database_url,
                    TUNER_PERIOD_S="1", TUNER_ALPHA="0.5", **NO_PERIODIC_RELOAD)
    await register(redis_url, namespace, CLUSTER, NODES)
    await migrate(database_url)
    store = open_store(database_url)
    tuner_log = tmp_path / "logs" / "tuner.log"
    try:
        async with services(env, tmp_path, ("templater", "collector", "tuner")), \
                api_on(kafka_bootstrap, redis_url, namespace, database_url, tmp_path) as api, \
                tap(kafka_bootstrap, name(Topic.OPS_TASKS, namespace)) as watch:
            opted = await api.put("/api/templates/scale_out",
                                  {"yaml": TUNABLE_SCALE_OUT, "reason": "opt in to tuning"})
            assert opted.json()["version"] == 2, opted.text
            await loaded(tmp_path, "scale_out.v2")
            before = await planned(watch, need("scale_out", POOL), kafka_bootstrap, namespace)
            assert (before.template, before.steps[0].action.nodes) == (  # type: ignore[union-attr]
                "scale_out.v2", 2)

            # Pinned: the measures say 200 per node (twice 100), but nothing is tuned.
            await api.post("/api/templates/scale_out/pin", {"reason": "audit week"})
            seq = await feed(kafka_bootstrap, namespace, tmp_path, 0, 6, 200.0)
            def would_have() -> bool:
                return any("would have set" in line and "nodes_per_scale_out 2 -> 1" in line
                           for line in tuner_log.read_text(errors="replace").splitlines())

            await until(would_have, 90, "the tuner to say what it would have done")
            async with store.session() as session:
                assert [v.version for v in await history(session, "scale_out")] == [2, 1]

            await api.post("/api/templates/scale_out/unpin", {"reason": "audit over"})
            await feed(kafka_bootstrap, namespace, tmp_path, seq, 2, 200.0)

            async def tuned() -> bool:
                async with store.session() as session:
                    return (await history(session, "scale_out"))[0].origin == "tuned"

            await until(tuned, 90, "a tuned scale_out version")
            async with store.session() as session:
                latest = (await history(session, "scale_out"))[0]
            assert (latest.version, latest.actor) == (3, "tuner")
            assert "nodes_per_scale_out: 1" in latest.yaml
            assert "nodes_per_scale_out 2 -> 1" in latest.reason
            assert latest.evidence["previous_value"] == 2
            assert latest.evidence["value"] == 1
            assert latest.evidence["measured_throughput_per_node"] == pytest.approx(200.0)
            [measure] = latest.evidence["measures"]
            assert (measure["pool"], measure["node_type"]) == (POOL, "Simulated GPU")
            assert measure["samples"] >= 6
            await loaded(tmp_path, "scale_out.v3")
            audited = [e for e in await api.audit() if e.action == "template_tuned"]
            assert [(e.actor, e.result) for e in audited] == [("tuner", "saved scale_out.v3")]

            after = await planned(watch, need("scale_out", POOL), kafka_bootstrap, namespace)
            assert (after.template, after.steps[0].action.nodes) == (  # type: ignore[union-attr]
                "scale_out.v3", 1)
    finally:
        await store.close()

