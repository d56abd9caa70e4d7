"""The I/O behind the health endpoints: each dependency asked once, within a bound, and what
has ended of the process's own work (its background loops, its broker's consumers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from faststream.kafka import KafkaBroker
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from common.health.policy import Answer, CheckResult, Phase, checks_to_run, readiness

Ping = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class Dependency:
    """Something the process cannot work without, by name, and how to ask it (raises when it
    does not answer)."""

    name: str
    ping: Ping


def kafka(broker: KafkaBroker, timeout_s: float) -> Dependency:
    """The broker's own connection: its admin client describes the cluster."""
    async def ping() -> None:
        if not await broker.ping(timeout_s):
            raise ConnectionError("the broker did not answer")
    return Dependency("kafka", ping)


def redis(client: Redis) -> Dependency:
    """PING on the process's own client, the very connections its work uses."""
    async def ping() -> None:
        await client.ping()
    return Dependency("redis", ping)


def database(engine: AsyncEngine) -> Dependency:
    """The task store: a connection from the process's own pool runs `SELECT 1`."""
    async def ping() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    return Dependency("database", ping)


async def check(dependency: Dependency, timeout_s: float) -> CheckResult:
    """One dependency's answer within `timeout_s`, so a probe never hangs on it."""
    try:
        async with asyncio.timeout(timeout_s):
            await dependency.ping()
    except TimeoutError:
        return CheckResult(dependency.name, False, f"no answer within {timeout_s:g} s")
    # Whatever a client raises means the same here: the dependency did not answer; the probe
    # reports it, and the work that needs it fails closed on its own.
    except Exception as err:
        return CheckResult(dependency.name, False, f"{type(err).__name__}: {err}")
    return CheckResult(dependency.name, True)


async def check_all(dependencies: Iterable[Dependency], timeout_s: float) -> list[CheckResult]:
    """Every dependency asked at once: the answer takes as long as the slowest, at most
    `timeout_s`."""
    return list(await asyncio.gather(*(check(d, timeout_s) for d in dependencies)))


async def answer_readiness(phase: Phase, dependencies: Sequence[Dependency],
                           timeout_s: float) -> Answer:
    """`/readyz`: the dependencies the phase calls for, asked, and the answer they make."""
    wanted = set(checks_to_run(phase, [d.name for d in dependencies]))
    return readiness(phase, await check_all([d for d in dependencies if d.name in wanted],
                                            timeout_s))


def ended_tasks(tasks: Sequence[asyncio.Task[None]]) -> list[str]:
    """The names of the background loops that are no longer running (a loop only ends when
    something it cannot handle killed it, or somebody cancelled it)."""
    return [task.get_name() for task in tasks if task.done()]


def ended_consumers(broker: KafkaBroker) -> list[str]:
    """The consumer groups of the broker's subscribers whose consuming task has ended.

    FastStream runs each subscriber's consume loop in tasks of its own and starts a new one
    when one raises; a subscriber none of whose tasks is still running consumes nothing more
    until the process restarts.
    """
    ended: list[str] = []
    for subscriber in broker.subscribers:
        tasks: Sequence[asyncio.Task[object]] = getattr(subscriber, "tasks", ())
        if not getattr(subscriber, "running", True) or (
                tasks and all(task.done() for task in tasks)):
            ended.append(f"consumer {getattr(subscriber, 'group_id', None) or subscriber}")
    return ended
