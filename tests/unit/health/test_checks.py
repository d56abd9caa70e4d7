"""The bounded checks (common/health/checks.py): a dependency that hangs is reported
within the bound, all of them at once; one that fails is named with what it raised; a loop
task that ended is named."""

from __future__ import annotations

import asyncio

from common.health.checks import (
    Dependency,
    answer_readiness,
    check,
    check_all,
    ended_tasks,
)
from common.health.policy import CheckResult, Phase

BOUND_S = 0.2


async def hangs() -> None:
    await asyncio.Event().wait()


async def refuses() -> None:
    raise ConnectionRefusedError("connection refused")


async def answers() -> None:
    return None


async def test_a_dependency_that_hangs_is_reported_within_the_bound() -> None:
    assert await check(Dependency("redis", hangs), BOUND_S) == CheckResult(
        "redis", False, "no answer within 0.2 s")


async def test_a_dependency_that_fails_is_named_with_what_it_raised() -> None:
    assert await check(Dependency("database", refuses), BOUND_S) == CheckResult(
        "database", False, "ConnectionRefusedError: connection refused")


async def test_every_dependency_is_asked_at_once() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await check_all([Dependency("kafka", answers), Dependency("redis", hangs),
                               Dependency("database", hangs)], BOUND_S)
    # Two that hang take one bound, not two.
    assert loop.time() - started < 2 * BOUND_S
    assert [(r.name, r.ok) for r in results] == [("kafka", True), ("redis", False),
                                                 ("database", False)]


async def test_nothing_is_asked_before_start_up_has_finished() -> None:
    asked: list[str] = []

    async def ping() -> None:
        asked.append("redis")

    answer = await answer_readiness(Phase.STARTING, [Dependency("redis", ping)], BOUND_S)
    assert (answer.status, asked) == (503, [])
    answer = await answer_readiness(Phase.RUNNING, [Dependency("redis", ping)], BOUND_S)
    assert (answer.status, asked) == (200, ["redis"])


async def test_a_loop_task_that_ended_is_named() -> None:
    running = asyncio.create_task(hangs(), name="dispatcher")
    ended = asyncio.create_task(answers(), name="sweep")
    await ended
    try:
        assert ended_tasks([running, ended]) == ["sweep"]
    finally:
        running.cancel()
