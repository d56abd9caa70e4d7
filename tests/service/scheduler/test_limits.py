"""The scheduler's limits end to end on the real redis-server (the bus only records):
breakers keyed on task.kind (per cluster or per node), agent rejections left out of the
count, the offline budget and the rate limit holding tasks in the queue; a limit Redis cannot
answer for holding them too, and a bug in a limit propagating instead."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, NoReturn

import pytest
from redis.asyncio import Redis

from common.errors import PermanentError
from schemas.events.v1 import Alert, OpsTask, TaskScheduled
from schemas.topics import Topic
from services.scheduler.breaker_store import UNREADABLE, BreakerStore
from services.scheduler.handlers import Scheduler
from services.scheduler.queue import TaskQueue
from services.scheduler.rate_limit import RateLimiter
from services.scheduler.relations_store import RelationStore
from services.scheduler.safety_store import ADMIT_IN_FLIGHT, SafetyStore
from services.scheduler.settings import SchedulerSettings
from services.shared.audit import AuditLog
from services.shared.redis_client import Keys, connect_redis
from tests.ports import free_port
from tests.service.scheduler.helpers import Clock, RecordingBus, final_event, pool_health, task


def scheduler(redis: Redis, keys: Keys, clock: Clock, *, relations: bool = False,
              **settings: Any) -> Scheduler:
    config = SchedulerSettings(**({"rate_burst": 100} | settings))
    return Scheduler(config, TaskQueue(redis, keys), RecordingBus(),
                     BreakerStore(redis, keys, config.breaker_config, clock=clock),
                     SafetyStore(redis, keys, config.pool_health_ttl_s),
                     RateLimiter(redis, keys, config.rate_per_s, config.rate_burst,
                                 clock=clock),
                     clock=clock.utc,
                     relations=RelationStore(redis, keys) if relations else None)


def bus(s: Scheduler) -> RecordingBus:
    assert isinstance(s.bus, RecordingBus)
    return s.bus


def dispatched(s: Scheduler) -> list[str]:
    """Targets of the tasks dispatched so far, in order."""
    return [e.task.target for e in bus(s).on(Topic.OPS_TASKS_SCHEDULED)
            if isinstance(e, TaskScheduled)]


def alerts(s: Scheduler) -> list[Alert]:
    return [e for e in bus(s).on(Topic.OPS_ALERTS) if isinstance(e, Alert)]


async def queue(s: Scheduler, *tasks: OpsTask) -> None:
    # Fresh health every time: the scheduler refuses health older than a minute.
    await s.on_pool_health(pool_health({"up": 100}, s.clock()))  # a budget of 10
    for t in tasks:
        await s.on_task(t)


async def fail(s: Scheduler, *tasks: OpsTask, cause: str = "failed") -> None:
    """The final events of tasks that ran (indexed as `on_task` indexes them) and failed."""
    for t in tasks:
        await s.breakers.remember_task(t, s.breaker_of(t))
        await s.on_task_event(final_event(t.task_id, "failed", cause, at=s.clock()))


# ------------------------------------------------------------------ breaker scope and kind


async def test_with_the_node_scope_a_bad_node_trips_only_its_own_breaker(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_scope="node")
    await fail(s, task("node-1"), task("node-1"), task("node-1"))
    state, _ = await s.breakers.load("local", "offline@node-1")
    assert state.status == "OPEN"
    assert [a.dedup_key for a in alerts(s)] == ["breaker.local.node.offline.node-1"]

    await queue(s, task("node-1"), task("node-2"))
    await s.dispatch()
    assert dispatched(s) == ["node-2"]
    assert (await s.breakers.load("local", "offline"))[1] == 0  # the cluster one: untouched


async def test_with_the_cluster_scope_failures_on_different_nodes_add_up(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    await fail(s, task("node-0"), task("node-1"), task("node-2"))
    assert (await s.breakers.load("local", "offline"))[0].status == "OPEN"
    await queue(s, task("node-9"))
    await s.dispatch()
    assert dispatched(s) == []


async def test_an_open_node_breaker_holds_every_kind_on_its_node_until_reset(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_scopes={"offline": "node"})
    await fail(s, task("node-1"), task("node-1"), task("node-1"))
    assert await s.breakers.holding("local") == {"offline@node-1"}
    [alert] = alerts(s)
    assert alert.dedup_key == "breaker.local.node.offline.node-1"
    assert "(node scope)" in alert.message
    assert "node node-1" in alert.message

    await queue(s, task("node-1", kind="online"), task("node-2", kind="online"))
    await s.dispatch()
    assert dispatched(s) == ["node-2"]  # another kind, on the stopped node: held too
    await s.breakers.reset("local", "offline@node-1", "ada", "fixed", AuditLog(redis, keys))
    assert await s.breakers.holding("local") == set()
    await s.dispatch()
    assert dispatched(s) == ["node-2", "node-1"]


async def test_an_open_cluster_breaker_holds_every_task_of_its_cluster_only(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_scopes={"offline": "cluster"})
    await fail(s, task("node-0"), task("node-1"), task("node-2"))
    assert (await s.breakers.load("local", "offline@*"))[0].status == "OPEN"
    [alert] = alerts(s)
    assert alert.dedup_key == "breaker.local.cluster.offline"
    await queue(s, task("node-7", kind="online"), task("node-8", kind="scale_out"),
                task("node-9", kind="online", cluster="other"))
    await s.dispatch()
    assert dispatched(s) == ["node-9"]


async def test_a_templates_scope_overrides_the_kinds(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    scoped = [task(f"node-{i}").model_copy(update={"breaker_scope": "cluster"})
              for i in range(3)]
    for t in scoped:
        await s.on_task(t)
    await fail(s, *scoped)
    assert await s.breakers.holding("local") == {"offline@*"}


async def test_breakers_key_on_the_task_kind_not_the_need_kind(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    await fail(s, *[task(f"node-{i}", kind="migrate") for i in range(3)])
    assert (await s.breakers.load("local", "migrate"))[0].status == "OPEN"
    assert (await s.breakers.load("local", "offline"))[1] == 0
    # The parent offline task still runs; another migration does not.
    await queue(s, task("node-7"), task("node-8", kind="migrate"))
    await s.dispatch()
    assert dispatched(s) == ["node-7"]


async def test_without_the_index_the_executors_kind_output_names_the_breaker(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    for _ in range(3):
        await s.on_task_event(final_event(task("n").task_id, "failed", "timeout", at=s.clock(),
                                          kind="remove_node", need_kind="scale_in"))
    assert (await s.breakers.load("local", "remove_node"))[0].status == "OPEN"
    assert (await s.breakers.load("local", "scale_in"))[1] == 0


# ------------------------------------------------------------------ agent rejections


async def test_agent_rejections_are_not_counted_as_failures(
        redis: Redis, keys: Keys, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    s = scheduler(redis, keys, clock)
    rejected = [task(f"node-{i}") for i in range(5)]
    caplog.set_level("INFO", logger="clusterwarden.scheduler")
    await fail(s, *rejected, cause="rejected")
    state, _ = await s.breakers.load("local", "offline")
    assert (state.status, state.window) == ("CLOSED", ())
    assert f"outcome of task {rejected[0].task_id} not counted" in caplog.text
    assert alerts(s) == []

    await fail(s, *[task(f"node-{i}") for i in range(3)], cause="children_failed")
    assert (await s.breakers.load("local", "offline"))[0].status == "OPEN"


async def test_a_rejected_half_open_trial_gives_the_trial_back(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    # `online` is not disruptive: after the wait one trial may run.
    s = scheduler(redis, keys, clock, breaker_wait_s=60.0)
    await fail(s, *[task(f"node-{i}", kind="online") for i in range(3)])
    clock.advance(61.0)
    trial, other = task("node-5", kind="online"), task("node-6", kind="online")
    await queue(s, trial)
    await s.dispatch()
    await queue(s, other)
    await s.dispatch()
    assert dispatched(s) == ["node-5"]
    assert (await s.breakers.load("local", "online"))[0].status == "HALF_OPEN"

    await fail(s, trial, cause="rejected")
    state, _ = await s.breakers.load("local", "online")
    assert (state.status, state.trial_task, state.openings) == ("OPEN", "", 1)
    await s.dispatch()  # the next task is the new trial at once, no half-open limit to wait
    assert dispatched(s) == ["node-5", "node-6"]


async def test_a_trial_held_back_by_a_later_limit_gives_the_trial_back(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_wait_s=60.0, rate_limited_kinds=("online",),
                  rate_burst=1)
    await fail(s, *[task(f"node-{i}", kind="online") for i in range(3)])
    clock.advance(61.0)
    assert (await s.rate_limiter.take("local", "online")).allowed  # the only token, gone
    await queue(s, task("node-5", kind="online"))
    await s.dispatch()
    assert dispatched(s) == []
    state, _ = await s.breakers.load("local", "online")
    assert (state.status, state.trial_task) == ("OPEN", "")
    clock.advance(10.0)
    await s.dispatch()
    assert dispatched(s) == ["node-5"]
    assert (await s.breakers.load("local", "online"))[0].status == "HALF_OPEN"


# ------------------------------------------------------------------ budget and rate limit


async def test_the_rate_limit_holds_tasks_in_the_queue_until_a_token_is_due(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, rate_burst=2, rate_per_s=0.1)
    await queue(s, task("node-1"), task("node-2"), task("node-3"))
    await s.dispatch()
    first = dispatched(s)
    assert len(first) == 2
    assert await s.queue.depth() == 1
    # The third was counted in the budget, then given its place back when refused a token.
    assert await s.safety.in_flight("local", "default", clock.now) == 2
    clock.advance(9.0)
    await s.dispatch()
    assert dispatched(s) == first
    clock.advance(1.0)
    await s.dispatch()
    assert sorted(dispatched(s)) == ["node-1", "node-2", "node-3"]


async def test_kinds_outside_the_rate_limit_take_no_token(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, rate_burst=1)
    await queue(s, *[task(f"node-{i}", kind="online") for i in range(3)],
                task("node-8", kind="remove_node"), task("node-9", kind="remove_node"))
    await s.dispatch()
    sent = dispatched(s)
    assert len([t for t in sent if t in ("node-8", "node-9")]) == 1
    assert {"node-0", "node-1", "node-2"} <= set(sent)


async def test_offline_and_remove_node_tasks_share_the_pool_budget(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    await s.on_pool_health(pool_health({"up": 10}, s.clock()))  # roundup(10%) = 1
    budgeted = {"node-1": task("node-1"), "node-2": task("node-2", kind="remove_node")}
    for t in (*budgeted.values(), task("node-3", kind="migrate")):
        await s.on_task(t)
    await s.dispatch()
    sent = dispatched(s)
    assert "node-3" in sent  # a migration spends no budget
    (first,) = set(sent) & set(budgeted)
    await s.on_task_event(final_event(budgeted[first].task_id, "succeeded", at=s.clock()))
    await s.dispatch()
    assert set(dispatched(s)) == {"node-1", "node-2", "node-3"}


async def test_a_budget_refusal_takes_no_token(redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, rate_burst=1)
    # The budget is used up by the down node.
    await s.on_pool_health(pool_health({"up": 9, "down": 1}, s.clock()))
    await s.on_task(task("node-1"))
    await s.dispatch()
    assert dispatched(s) == []
    assert (await s.rate_limiter.take("local", "offline")).allowed


# ------------------------------------------------------------------ outages and bugs


@pytest.fixture
async def down() -> AsyncIterator[Redis]:
    """A client, made as the services make theirs, of a redis-server that is not there."""
    client = connect_redis(f"redis://127.0.0.1:{free_port()}/0")
    yield client
    await client.aclose()


@pytest.mark.parametrize("limit", ["pool health", "budget", "rate limit"])
async def test_a_limit_redis_cannot_answer_for_holds_the_task(
        redis: Redis, keys: Keys, clock: Clock, down: Redis, limit: str) -> None:
    s = scheduler(redis, keys, clock)
    await queue(s, task("node-1"))
    safety, rate_limiter = s.safety, s.rate_limiter
    if limit == "pool health":
        s.safety = SafetyStore(down, keys, s.settings.pool_health_ttl_s)
    elif limit == "budget":
        s.safety = SafetyStore(redis, keys, s.settings.pool_health_ttl_s)
        s.safety._admit = down.register_script(ADMIT_IN_FLIGHT)
    else:
        s.rate_limiter = RateLimiter(down, keys, s.settings.rate_per_s, s.settings.rate_burst)
    await s.dispatch()  # fails closed: no error, nothing dispatched
    assert dispatched(s) == []
    assert await s.queue.depth() == 1
    assert await safety.in_flight("local", "default", clock.now) == 0  # no place kept
    s.safety, s.rate_limiter = safety, rate_limiter  # Redis is back
    await s.dispatch()
    assert dispatched(s) == ["node-1"]


async def test_a_breaker_redis_cannot_answer_for_is_closed(keys: Keys, clock: Clock,
                                                          down: Redis) -> None:
    store = BreakerStore(down, keys, SchedulerSettings().breaker_config, clock=clock)
    decision, state = await store.admit("local", "offline", "task-1")
    assert (decision.allowed, decision.reason, state) == (False, UNREADABLE, None)


def bug(*_: object) -> NoReturn:
    raise TypeError("unsupported operand type(s) for -: 'str' and 'float'")


async def async_bug(*_: object) -> NoReturn:
    bug()


@pytest.mark.parametrize("limit", ["breaker", "pool health", "budget", "rate limit"])
async def test_a_bug_in_a_limit_propagates_instead_of_holding_the_task(
        redis: Redis, keys: Keys, clock: Clock, monkeypatch: pytest.MonkeyPatch,
        limit: str) -> None:
    s = scheduler(redis, keys, clock)
    await queue(s, task("node-1"))
    if limit == "breaker":
        monkeypatch.setattr("services.scheduler.breaker.admits", bug)
    elif limit == "pool health":
        monkeypatch.setattr(s.safety, "load_health", async_bug)
    elif limit == "budget":
        monkeypatch.setattr(s.safety, "admit_in_flight", async_bug)
    else:
        monkeypatch.setattr(s.rate_limiter, "take", async_bug)
    with pytest.raises(TypeError, match="unsupported operand"):
        await s.dispatch()
    assert dispatched(s) == []


# ------------------------------------------------------------------ alerts resolve


async def test_a_breaker_closed_by_its_trial_resolves_its_open_alert(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock, breaker_wait_s=60.0)
    await fail(s, *[task(f"node-{i}", kind="online") for i in range(3)])
    (opened,) = alerts(s)
    clock.advance(61.0)
    trial = task("node-5", kind="online")
    await queue(s, trial)
    await s.dispatch()
    await s.breakers.remember_task(trial)
    await s.on_task_event(final_event(trial.task_id, "succeeded", at=s.clock()))
    assert (await s.breakers.load("local", "online"))[0].status == "CLOSED"
    opened_again, resolved = alerts(s)
    assert opened_again == opened
    assert (resolved.dedup_key, resolved.status, resolved.kind) == (
        opened.dedup_key, "resolved", "breaker_closed")


async def test_a_short_circuit_alert_resolves_once_the_pool_is_healthy_again(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    clock.advance(1.0)
    # Half the pool unhealthy: disruptive work is held, an alert raised.
    await s.on_pool_health(pool_health({"up": 5, "down": 5}, s.clock()))
    await s.on_task(task("node-1"))
    await s.dispatch()
    assert dispatched(s) == []
    (raised,) = alerts(s)
    assert (raised.kind, raised.status) == ("short_circuit", "firing")

    clock.advance(1.0)
    # Still sick: nothing resolves.
    await s.on_pool_health(pool_health({"up": 5, "down": 4}, s.clock()))
    assert len(alerts(s)) == 1
    clock.advance(1.0)
    await s.on_pool_health(pool_health({"up": 10}, s.clock()))
    _, resolved = alerts(s)
    assert (resolved.dedup_key, resolved.status) == (raised.dedup_key, "resolved")
    clock.advance(1.0)
    # Once: the episode is over.
    await s.on_pool_health(pool_health({"up": 10}, s.clock()))
    assert len(alerts(s)) == 2
    await s.dispatch()
    assert dispatched(s) == ["node-1"]


async def test_pool_health_dated_ahead_of_the_clock_is_refused_and_shadows_nothing(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    clock.advance(1.0)
    await s.on_pool_health(pool_health({"up": 5, "down": 5}, s.clock()))
    # Forged: all healthy, dated a day ahead, so that it would stay the newest all day.
    with pytest.raises(PermanentError, match="ahead of the clock"):
        await s.on_pool_health(pool_health({"up": 10}, s.clock() + timedelta(days=1)))
    await s.on_task(task("node-1"))
    await s.dispatch()
    assert dispatched(s) == []  # the genuine health still holds the short-circuit
    # Within the allowed skew it is a genuine report from a clock a little ahead.
    await s.on_pool_health(pool_health({"up": 10}, s.clock() + timedelta(seconds=10)))
    await s.dispatch()
    assert dispatched(s) == ["node-1"]


async def test_a_task_labelled_otherwise_that_drains_a_node_spends_the_offline_budget(
        redis: Redis, keys: Keys, clock: Clock) -> None:
    s = scheduler(redis, keys, clock)
    await s.on_pool_health(pool_health({"up": 10}, s.clock()))  # roundup(10%) = 1
    # Both called migrate by their template; the first drains and offlines its node.
    drains = task("node-1").model_copy(update={"action_type": "migrate"})
    other = task("node-2")  # a true offline task
    moves = task("node-3", kind="migrate")
    for t in (drains, other, moves):
        await s.on_task(t)
    await s.dispatch()
    # The budget of one node went to the task that drains, labelled as it may be; the
    # migration that takes no node out spends none.
    assert sorted(dispatched(s)) == ["node-1", "node-3"]
