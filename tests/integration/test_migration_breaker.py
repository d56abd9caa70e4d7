"""The migration breaker on the real broker, Redis and agent processes: job moves that fail
(injected on the agents) trip the breaker of kind `migrate` at its threshold; one alert is
raised, later migrations stay queued, also across a scheduler restart, and only an admin's
reset (`warden breaker reset`, through the API, audited under the token's user) lets them run
again, and succeed. The alert reaches Prometheus Alertmanager (the alerts service delivers
it), grouped by kind and cluster, and resolves there on the reset."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

import pytest

from agent import fleet
from common.settings import ServiceSettings
from common.signing import ensure_signer_keys
from schemas.events.v1 import Alert, NodeReport, OpsTask, TaskEvent
from schemas.topics import Topic
from services.alerts.records import list_alerts
from services.scheduler.breaker import BreakerConfig
from services.scheduler.breaker_store import BreakerStore
from services.shared.audit import AuditLog, audit_key
from services.shared.redis_client import Keys, connect_redis
from services.shared.registry import register
from services.store.db import migrate, open_store
from services.store.queries import list_audit
from tests.integration.harness import (
    ApiSite,
    Record,
    Tap,
    active_alerts,
    alertmanager_groups,
    is_up,
    log_lines,
    log_shows,
    name,
    services,
    stack_env,
    tap,
    until,
)
from tests.integration.test_console import wait_healthy
from warden import launcher

pytestmark = pytest.mark.timeout(600)

NODES = ["node-001", "node-002", "node-003", "node-004"]
FINAL = ("succeeded", "failed", "terminated")
WARDEN = Path(sys.executable).parent / "warden"
# Lines "held back by breaker" a check waits for before it judges that nothing was dispatched
# (one a dispatcher tick; see the checks).
TICKS = 3
ADMIN, ADMIN_TOKEN = "ada", "breaker-admin-token-0123456789"


def task_events(events: Tap) -> list[TaskEvent]:
    return [TaskEvent.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_TASK_EVENTS.value)]


def plans(events: Tap) -> dict[UUID, OpsTask]:
    return {e.task_id: e.task for e in task_events(events) if e.task is not None}


def states(events: Tap, task_id: UUID) -> list[str]:
    return [e.state for e in task_events(events) if e.task_id == task_id]


def final_state(events: Tap, task_id: UUID) -> str | None:
    return next((s for s in states(events, task_id) if s in FINAL), None)


def ended(events: Tap, task_id: UUID) -> Callable[[Record], bool]:
    """A predicate for `Tap.wait_for`: the task reached a final state."""
    return lambda _: final_state(events, task_id) is not None


def reached(events: Tap, task_id: UUID, state: str) -> Callable[[Record], bool]:
    """A predicate for `Tap.wait_for`: the task reached `state`."""
    return lambda _: state in states(events, task_id)


def offline_task(events: Tap, node: str) -> OpsTask | None:
    return next((t for t in plans(events).values()
                 if t.need_kind == "offline" and t.target == node and t.parent_task_id is None),
                None)


def migrations_of(events: Tap, parent: UUID) -> list[OpsTask]:
    return [t for t in plans(events).values() if t.parent_task_id == parent]


def trail(events: Tap, task_id: UUID) -> str:
    return "\n".join(f"{e.state} {e.step_index} {e.step_state} {e.reason} {dict(e.outputs)}"
                     for e in task_events(events) if e.task_id == task_id)


def alerts(events: Tap) -> list[Alert]:
    return [Alert.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_ALERTS.value)]


def migrate_alerts(events: Tap) -> set[UUID]:
    """The breaker_open alerts of the migrate breaker, as a deduplicating consumer sees them.

    The scheduler checks, publishes, then remembers that it alerted; two of its paths (an
    outcome that opens the breaker, a task the breaker holds back) may both publish in that
    moment, with the same event id (fixed per opening): one alert.
    """
    return {a.event_id for a in alerts(events)
            if a.kind == "breaker_open" and a.dedup_key == "breaker.itest.kind.migrate"}


def running_on(events: Tap, node: str) -> set[str]:
    """The jobs the newest report of `node` shows running."""
    latest: NodeReport | None = None
    for record in events.records:
        if record.topic.endswith(Topic.NODE_REPORTS.value) and record.key == node.encode():
            report = NodeReport.model_validate_json(record.value)
            if latest is None or report.seq > latest.seq:
                latest = report
    return set() if latest is None else {j.job_id for j in latest.jobs if j.state == "running"}


async def offline_with_migrations(events: Tap, state_dir: Path, node: str) -> OpsTask:
    """Fault `node` (XID 79) and wait until its offline task has planned its job moves."""
    fleet.inject_fault(state_dir, node, xid=[79])
    await events.wait_for(lambda _: offline_task(events, node) is not None, 90,
                          f"the offline task of {node}")
    task = offline_task(events, node)
    assert task is not None
    await events.wait_for(lambda _: len(migrations_of(events, task.task_id)) == 2, 90,
                          f"the two job moves out of {node}")
    return task


async def test_failed_migrations_open_the_breaker_until_an_audited_reset(
    kafka_bootstrap: str, redis_url: str, alertmanager_url: str, namespace: str,
    tmp_path: Path
) -> None:
    site = ApiSite.at(tmp_path)
    api_url, database_url = site.base, site.database_url
    env = stack_env(
        kafka_bootstrap, redis_url, namespace, tmp_path, WARDEN_LOG_LEVEL="INFO",
        # The reset goes through the API, as the admin's token says who they are.
        **site.env(f"{ADMIN_TOKEN}:{ADMIN}:admin"),
        # Two simulated jobs per node (training and inference): two moves per offline node.
        AGENT_JOBS="sim:train,infer",
        ANALYZER_ENABLED_NEEDS='["offline"]', ANALYZER_POOL_PERIOD_S="1",
        CAPACITY_PROVIDER="none",
        # Three of four nodes go offline: neither the budget nor the short-circuit may
        # be what holds the moves back, only the breaker.
        SCHEDULER_OFFLINE_BUDGET_FRACTION="1.0",
        SCHEDULER_SHORT_CIRCUIT_UNHEALTHY_FRACTION="0.9",
        SCHEDULER_RATE_PER_S="10",
        ALERTMANAGER_URL=alertmanager_url, ALERTS_DELIVERY_INTERVAL_S="0.5",
    )
    trusted = ensure_signer_keys(tmp_path / "keys")
    redis = connect_redis(redis_url)
    keys = Keys(namespace)
    store = BreakerStore(redis, keys, lambda _: BreakerConfig(disruptive=True))
    breaker_key = store.key("itest", "migrate")

    async def breaker_open() -> bool:
        return await redis.hget(breaker_key, "status") == b"OPEN"

    await migrate(database_url)  # once, before the store and the API both start
    async with services(env, tmp_path, (*launcher.SERVICES, launcher.API)) as running:
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(len(NODES), 2, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.OPS_TASK_EVENTS, namespace),
                           name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_ALERTS, namespace),
                           name(Topic.NODE_REPORTS, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")
                    # Every agent answers migrate_job with failed "injected_failure".
                    fleet.inject_fault(tmp_path, node, fail_actions=["migrate_job"])

                # ---- two failed moves (node-001's jobs): below the threshold of 3
                first = await offline_with_migrations(watch, tmp_path, "node-001")
                await watch.wait_for(lambda _: final_state(watch, first.task_id) is not None,
                                     120, "the offline task of node-001 to finish")
                for child in migrations_of(watch, first.task_id):
                    assert child.kind == "migrate"
                    assert final_state(watch, child.task_id) == "failed", trail(
                        watch, child.task_id)
                    # Transient: retried up to the step's attempts before the child failed.
                    attempts = [e for e in task_events(watch) if e.task_id == child.task_id
                                and e.step_state == "failed"]
                    assert len(attempts) == child.steps[0].max_attempts, trail(
                        watch, child.task_id)
                    assert all("failed injected_failure" in e.reason for e in attempts)
                assert final_state(watch, first.task_id) == "failed"

                # The scheduler counts outcomes as it reads them from the task events.
                async def two_counted() -> bool:
                    return await redis.hget(breaker_key, "window") == b"FF"

                await until(two_counted, 30, "both failed moves counted by the breaker")
                assert await redis.hget(breaker_key, "status") == b"CLOSED"

                # ---- the next failed move (one of node-002's) is the third: it opens
                second = await offline_with_migrations(watch, tmp_path, "node-002")
                await until(breaker_open, 120, "the migrate breaker to open")
                alert = await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.OPS_ALERTS.value)
                    and b"breaker_open" in r.value, 30, "the breaker_open alert")
                raised = Alert.model_validate_json(alert.value)
                assert (raised.severity, raised.kind, raised.dedup_key) == (
                    "critical", "breaker_open", "breaker.itest.kind.migrate")
                assert await redis.hget(breaker_key, "openings") == b"1"

                # ---- a person sees it: Alertmanager has it firing, grouped by kind and cluster
                async def firing_in_alertmanager() -> bool:
                    return bool(active_alerts(await alertmanager_groups(alertmanager_url,
                                                                        namespace)))

                await until(firing_in_alertmanager, 30, "the alert firing in Alertmanager")
                (group,) = await alertmanager_groups(alertmanager_url, namespace)
                assert group["labels"] == {"alertname": "breaker_open", "cluster": "itest"}
                (firing,) = active_alerts([group])
                assert firing["labels"]["dedup_key"] == "breaker.itest.kind.migrate"
                assert firing["labels"]["severity"] == "critical"
                # The sibling of the move that failed third is held, unless the dispatcher had
                # taken it before that outcome was counted (sibling moves run side by side):
                # each sibling is either dispatched or, in the scheduler's log, held back by
                # the breaker (it is the only migrate task queued, so the breaker is asked
                # about it on every tick). A held one stays held: the breaker is open.
                scheduler = next(i for i, s in enumerate(running) if s.name == "scheduler")
                log = running[scheduler].log_path
                siblings = migrations_of(watch, second.task_id)

                def held_back(ids: set[UUID]) -> Callable[[str], bool]:
                    return lambda line: "held back by breaker itest/migrate" in line and any(
                        f"task {t} " in line for t in ids)

                async def sorted_out() -> bool:
                    await watch.catch_up()
                    lines = log_lines(log)
                    return all("dispatched" in states(watch, c.task_id)
                               or any(held_back({c.task_id})(line) for line in lines)
                               for c in siblings)

                await until(sorted_out, 60,
                            "each sibling move dispatched or held back by the breaker")
                held = [c for c in siblings if "dispatched" not in states(watch, c.task_id)]
                for child in siblings:
                    if child not in held:
                        await watch.wait_for(ended(watch, child.task_id), 60,
                                             f"move {child.target} to end")
                        assert final_state(watch, child.task_id) == "failed", trail(
                            watch, child.task_id)
                assert len(held) <= 1
                # Where the held move is to go stays up; the other node fails next.
                destination = getattr((held or siblings)[0].steps[1].action, "node_id", "")
                faulty = next(n for n in ("node-003", "node-004") if n != destination)

                # ---- moves planned after it opened are held in the queue, never dispatched
                third = await offline_with_migrations(watch, tmp_path, faulty)
                held += migrations_of(watch, third.task_id)
                held_ids = {child.task_id for child in held}
                for child in held:
                    await watch.wait_for(reached(watch, child.task_id, "queued"), 30,
                                         f"move {child.target} queued")
                # Every tick claims all of them and logs the first the breaker refuses (the
                # rest of the tick does not ask again). The second such line after they were
                # all queued is from a tick that started after that, the third shows that tick
                # ended: whatever it published (a dispatch) is on the topics.
                await log_shows(log, held_back(held_ids), "the queued moves held back",
                                count=TICKS, since=log.stat().st_size)
                await watch.catch_up()
                for child in held:
                    assert "dispatched" not in states(watch, child.task_id), trail(
                        watch, child.task_id)

                # ---- the breaker survives a scheduler restart: still held
                launcher.stop_services([running[scheduler]])
                restarted_at = log.stat().st_size
                running[scheduler] = launcher.start_services(tmp_path, env, ("scheduler",))[0]
                # The restarted scheduler reads the open breaker back and holds them too, tick
                # after tick (as above); then nothing it published is missed.
                await log_shows(log, held_back(held_ids),
                                "the moves held back by the restarted scheduler",
                                count=TICKS, since=restarted_at, timeout_s=120)
                await watch.catch_up()
                for child in held:
                    assert "dispatched" not in states(watch, child.task_id), trail(
                        watch, child.task_id)
                    task_id = str(child.task_id)
                    assert (await redis.zscore(keys.queue_ready(), task_id) is not None
                            or await redis.zscore(keys.queue_inflight(), task_id) is not None)
                assert await redis.hget(breaker_key, "status") == b"OPEN"
                assert len(migrate_alerts(watch)) == 1

                # ---- the fault is repaired; an admin resets the breaker (audited)
                for node in NODES:
                    fleet.inject_fault(tmp_path, node, fail_actions=[])
                reason = "migrate_job failures were injected by the test; cleared"
                await wait_healthy(api_url, 120)
                cli = await asyncio.create_subprocess_exec(
                    str(WARDEN), "breaker", "reset", "--cluster", "itest", "--kind", "migrate",
                    "--reason", reason,
                    env={**os.environ, **env, "WARDEN_API_URL": api_url,
                         "WARDEN_API_TOKEN": ADMIN_TOKEN},
                    cwd=fleet.REPO_ROOT,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
                output, _ = await asyncio.wait_for(cli.communicate(), 60)
                printed = output.decode(errors="replace")
                assert cli.returncode == 0, printed
                assert "breaker itest/migrate: OPEN -> CLOSED" in printed, printed

                # Audited twice under the token's user: in the scheduler's stream (with the
                # reset, atomically) and in the API's log.
                # Verified under the stack's audit key (its processes share tmp_path).
                audit = AuditLog(redis, keys,
                                 key=audit_key(ServiceSettings(state_dir=str(tmp_path))))
                entry = (await audit.read(1))[-1].entry
                assert (entry.actor, entry.role, entry.action, entry.target, entry.reason,
                        entry.result) == (ADMIN, "admin", "breaker_reset", "itest/migrate",
                                          reason, "OPEN -> CLOSED")
                verdict = await audit.verify()
                assert verdict.ok, verdict
                task_store = open_store(database_url)
                try:
                    async with task_store.session() as session:
                        rows, _ = await list_audit(session, 100, 0)
                finally:
                    await task_store.close()
                assert [(r.actor, r.role, r.target, r.reason, r.result) for r in rows
                        if r.action == "breaker_reset"] == [
                    (ADMIN, "admin", "breaker/itest/migrate", reason, "OPEN -> CLOSED")]
                assert await redis.hget(breaker_key, "status") == b"CLOSED"
                notice = await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.OPS_ALERTS.value)
                    and b"breaker_reset" in r.value, 30, "the breaker_reset alert")
                assert Alert.model_validate_json(notice.value).severity == "info"

                # ---- and resolves: gone from Alertmanager's active alerts, resolved in the store
                # (only the migrate breaker's: the offline breaker may open meanwhile, when the
                # held parent succeeds after its two failed siblings, and raise its own)
                async def resolved_in_alertmanager() -> bool:
                    return not [a for a in active_alerts(await alertmanager_groups(
                        alertmanager_url, namespace))
                        if a["labels"]["dedup_key"] == "breaker.itest.kind.migrate"]

                await until(resolved_in_alertmanager, 30, "the alert resolved in Alertmanager")
                task_store = open_store(database_url)
                try:
                    async with task_store.session() as session:
                        listed, _ = await list_alerts(session, None, "itest", 10, 0)
                finally:
                    await task_store.close()
                kept = [a for a in listed if a.dedup_key == "breaker.itest.kind.migrate"]
                assert [(a.dedup_key, a.status, a.kind) for a in kept] == [
                    ("breaker.itest.kind.migrate", "resolved", "breaker_open")]
                assert kept[0].resolution is not None
                assert f"reset by {ADMIN}" in kept[0].resolution
                assert kept[0].delivered_at is not None

                # ---- the held moves run now, and succeed
                await watch.wait_for(lambda _: final_state(watch, third.task_id) is not None,
                                     180, f"the offline task of {faulty} to finish")
                assert final_state(watch, third.task_id) == "succeeded", trail(
                    watch, third.task_id)
                for child in held:
                    await watch.wait_for(ended(watch, child.task_id), 120,
                                         f"move {child.target} to end")
                    assert "dispatched" in states(watch, child.task_id)
                    assert final_state(watch, child.task_id) == "succeeded", trail(
                        watch, child.task_id)
                    assert getattr(child.steps[1].action, "node_id", "") == destination
                moved = {child.target for child in held}
                assert {f"{faulty}.train", f"{faulty}.infer"} <= moved
                await watch.wait_for(lambda _: moved <= running_on(watch, destination), 60,
                                     f"{sorted(moved)} running on {destination}")
                # One opening, one alert, however many moves it held back. (The offline
                # breaker has its own: the parents of the failed moves failed too.)
                assert len(migrate_alerts(watch)) == 1
                assert await redis.hget(breaker_key, "status") == b"CLOSED"
        finally:
            fleet.fleet_down(tmp_path)
            await redis.aclose()
