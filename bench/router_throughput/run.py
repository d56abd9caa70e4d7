"""The run: the router served as its subscribers serve it, the driver that submits and
answers, and the cases it measures."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from uuid import UUID

from redis.asyncio import Redis

from bench.router_throughput.instruments import ClientCount, Tap, connect_counted_redis
from bench.router_throughput.workload import (
    CLUSTER,
    MODELS,
    CaseResult,
    answer,
    commandstats_delta,
    node_names,
    node_reports,
    served_models,
    submission,
)
from common.errors import TransientError
from common.messaging import EventBus
from common.signing import CommandSigner
from schemas.events.v1 import (
    Command,
    CommandResult,
    MlTaskOutcome,
    MlTaskSubmitted,
    now_utc,
)
from services.router.handlers import Router
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.shared.redis_client import Keys
from services.shared.registry import register_nodes

# A message one of the driver's queues carries to the router.
M = TypeVar("M")
WAIT_TIMEOUT_S = 60.0
# The dead-letter middleware's retries of a TransientError (DeadLetterPolicy's default).
RETRY_DELAYS_S = (1.0, 2.0, 4.0)


def build_router(settings: RouterSettings, redis: Redis, bus: EventBus,
                 signer: CommandSigner) -> Router:
    """The router as services/router/app.py builds it."""
    keys = Keys(settings.namespace)
    return Router(
        settings, redis, keys, bus, signer,
        Registry(redis, keys, cache_s=settings.registry_cache_s,
                 forget_after_s=settings.registry_forget_after_s,
                 require_registration=settings.require_registration),
        StatsStore(keys, settings.stats_ttl_s),
    )


async def serve_cluster(router: Router, nodes: int, limit: int) -> int:
    """Enrol `nodes` nodes and feed the registry their reports; how many were kept."""
    names = node_names(nodes)
    await register_nodes(router.redis, router.keys, CLUSTER, names)
    reports = node_reports(CLUSTER, names, served_models(MODELS, limit), now_utc())
    applied = await router.registry.apply(reports)
    return sum(1 for a in applied if a == "kept")


class Service:
    """The router's consumers as services/router/app.py subscribes them: submissions and
    answers, each one message at a time (a subscriber's default), a TransientError retried
    after the dead-letter middleware's delays, and the sweep loop."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.submissions: asyncio.Queue[MlTaskSubmitted | None] = asyncio.Queue()
        self.results: asyncio.Queue[CommandResult | None] = asyncio.Queue()
        self.transient = 0
        self.errors = 0
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        """Until `stop`: the handler calls in progress end first (not cancelled)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._consume(self.submissions, self.router.on_submitted))
            group.create_task(self._consume(self.results, self.router.on_result))
            group.create_task(self._sweeping())

    def stop(self) -> None:
        self.stopping.set()
        self.submissions.put_nowait(None)
        self.results.put_nowait(None)

    async def _consume(self, queue: asyncio.Queue[M | None],
                       handler: Callable[[M], Awaitable[None]]) -> None:
        while (message := await queue.get()) is not None:
            for delay in (*RETRY_DELAYS_S, None):
                try:
                    await handler(message)
                    break
                except TransientError as err:
                    self.transient += 1
                    if delay is None:
                        self._failed(err)
                    else:
                        await asyncio.sleep(delay)
                except Exception as err:
                    self._failed(err)
                    break

    def _failed(self, err: Exception) -> None:
        self.errors += 1  # dead-lettered in the service
        print(f"handler failed: {err!r}", file=sys.stderr)

    async def _sweeping(self) -> None:
        interval = self.router.settings.sweep_interval_s
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), interval)
                return
            try:
                await self.router.sweep()
            except Exception as err:  # the service logs it and goes on
                print(f"sweep failed: {err!r}", file=sys.stderr)


@dataclass
class Flight:
    """One task's times (perf_counter)."""

    submitted: float
    command_at: float | None = None
    final_at: float | None = None
    state: str = ""


class Driver:
    """The load (tasks submitted) and the agents (every command answered as soon as it is
    published, successfully), timing the router."""

    def __init__(self, service: Service, deadline_s: float = 30.0) -> None:
        self.service = service
        self.deadline_s = deadline_s
        self.rng = random.Random(1)
        self.flights: dict[UUID, Flight] = {}
        self.answered: set[UUID] = set()
        self.duplicates = 0   # commands published again (answered again, as duplicates)
        self.dispatched = 0   # tasks whose first command went out
        self.done = 0         # tasks whose final outcome went out
        self.hold = False     # agents keep their answers (a wave's submission phase)
        self.held: list[CommandResult] = []
        self.changed = asyncio.Event()
        self.on_done: Callable[[], None] = lambda: None

    def submit(self) -> None:
        task = submission(CLUSTER, now_utc(), self.deadline_s)
        self.flights[task.task_id] = Flight(time.perf_counter())
        self.service.submissions.put_nowait(task)

    def commanded(self, at: float, command: Command) -> None:
        if command.correlation_id is None:
            return
        flight = self.flights.get(UUID(command.correlation_id))
        if flight is None:
            return
        if flight.command_at is None:
            flight.command_at = at
            self.dispatched += 1
            self.changed.set()
        # Every command is answered: a retry's too, and one published again (a duplicate).
        duplicate = command.event_id in self.answered
        self.duplicates += duplicate
        self.answered.add(command.event_id)
        result = answer(command, self.rng, duplicate)
        if self.hold:
            self.held.append(result)
        else:
            self.service.results.put_nowait(result)

    def finished(self, at: float, outcome: MlTaskOutcome) -> None:
        flight = self.flights.get(outcome.task_id)
        if flight is None or flight.final_at is not None:
            return
        flight.final_at, flight.state = at, outcome.state
        self.done += 1
        self.changed.set()
        self.on_done()

    async def until(self, counter: Literal["dispatched", "done"], target: int) -> None:
        """Until `counter` reaches `target`."""
        while getattr(self, counter) < target:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), WAIT_TIMEOUT_S)

    def release(self) -> None:
        self.hold = False
        for result in self.held:
            self.service.results.put_nowait(result)
        self.held.clear()

    async def closed_loop(self, tasks: int, concurrency: int) -> tuple[float, list[Flight]]:
        """`concurrency` tasks in flight (a new one as each ends) until `tasks` ended:
        (seconds, the tasks)."""
        first = len(self.flights)
        base = self.done
        started_at = time.perf_counter()

        def top_up() -> None:
            started = len(self.flights) - first
            while started < tasks and started - (self.done - base) < concurrency:
                self.submit()
                started += 1

        self.on_done = top_up
        try:
            top_up()
            await self.until("done", base + tasks)
        finally:
            self.on_done = lambda: None
        return time.perf_counter() - started_at, list(self.flights.values())[first:]

    async def waves(self, tasks: int, concurrency: int,
                    between: Callable[[], None] = lambda: None,
                    ) -> tuple[float, float, list[Flight]]:
        """Waves of `concurrency` submissions (their answers held until all were dispatched),
        then their answers: (submission s, result s, the tasks). `between` runs at each
        phase change (the caller reads its counters there)."""
        first = len(self.flights)
        submit_s = result_s = 0.0
        sent = 0
        while sent < tasks:
            size = min(concurrency, tasks - sent)
            dispatched, done = self.dispatched + size, self.done + size
            self.hold = True
            started = time.perf_counter()
            for _ in range(size):
                self.submit()
            await self.until("dispatched", dispatched)
            submit_s += time.perf_counter() - started
            between()
            started = time.perf_counter()
            self.release()
            await self.until("done", done)
            result_s += time.perf_counter() - started
            between()
            sent += size
        return submit_s, result_s, list(self.flights.values())[first:]


async def commandstats(redis: Redis) -> dict[str, Any]:
    return await redis.info("commandstats")


async def run_case(driver: Driver, tap: Tap, admin: Redis, tasks: int,
                   concurrency: int) -> CaseResult:
    out = CaseResult(concurrency=concurrency, tasks=tasks)
    phase = [0]
    sums = [[0, 0], [0, 0]]   # [submission, result] x [commands, round trips]
    mark = list(ClientCount.read())

    def between() -> None:
        now = ClientCount.read()
        target = sums[phase[0] % 2]
        target[0] += now[0] - mark[0]
        target[1] += now[1] - mark[1]
        mark[:] = now
        phase[0] += 1

    waits, timeouts = tap.waits, tap.timeouts
    transient, errors = driver.service.transient, driver.service.errors
    duplicates = driver.duplicates
    out.submit_s, out.result_s, in_waves = await driver.waves(tasks, concurrency, between)
    out.wave_client = (sums[0][0], sums[1][0])
    out.wave_trips = (sums[0][1], sums[1][1])

    before = await commandstats(admin)
    client = ClientCount.read()
    out.closed_s, in_loop = await driver.closed_loop(tasks, concurrency)
    after_client = ClientCount.read()
    out.server_cmds = commandstats_delta(before, await commandstats(admin))
    out.client_cmds = after_client[0] - client[0]
    out.round_trips = after_client[1] - client[1]
    out.latencies_ms = [((f.final_at or f.submitted) - f.submitted) * 1000.0 for f in in_loop]
    # Over both runs: decisions to wait, attempts timed out, tasks that did not succeed,
    # handler calls that failed (a transient error is retried).
    out.waits = tap.waits - waits
    out.timeouts = tap.timeouts - timeouts
    out.failed = sum(f.state != "succeeded" for f in in_waves + in_loop)
    out.transient = driver.service.transient - transient
    out.errors = driver.service.errors - errors
    out.duplicates = driver.duplicates - duplicates
    return out


async def forget_namespace(redis: Redis, keys: Keys) -> int:
    stale = [key async for key in redis.scan_iter(match=f"{keys.prefix}*", count=1000)]
    for i in range(0, len(stale), 500):
        await redis.delete(*stale[i:i + 500])
    return len(stale)


async def with_router(settings: RouterSettings, publish: bool,
                      run: Callable[[Router, Tap], Awaitable[None]]) -> None:
    """Build the router as the service does (the broker connected when `publish`), run
    `run`, then clean up the namespace's Redis keys."""
    from common.messaging import ensure_topics, make_broker
    from common.signing import local_signer
    from common.telemetry import setup_telemetry

    redis = connect_counted_redis(settings.redis_url)
    keys = Keys(settings.namespace)
    broker = None
    inner: EventBus | None = None
    if publish:
        await ensure_topics(settings.kafka_bootstrap_servers, settings.namespace)
        broker, _ = make_broker(settings, "router", setup_telemetry("router"))
        await broker.start()
        inner = EventBus(broker, settings.namespace)
    tap = Tap(inner)
    router = build_router(settings, redis, tap,
                          local_signer(settings.signing_key, settings.state_dir, "router"))
    try:
        await forget_namespace(redis, keys)
        await run(router, tap)
    finally:
        await forget_namespace(redis, keys)
        if broker is not None:
            await broker.stop()
        await redis.aclose()


async def bench(settings: RouterSettings, *, nodes: int, limit: int, tasks: int,
                concurrency: Sequence[int], warmup: int, publish: bool = True,
                profile: cProfile.Profile | None = None,
                report: Callable[[dict[str, Any]], None] = lambda row: None,
                ) -> list[dict[str, Any]]:
    """Every case's figures (also given to `report` as each case ends)."""
    rows: list[dict[str, Any]] = []

    async def run(router: Router, tap: Tap) -> None:
        kept = await serve_cluster(router, nodes, limit)
        if kept != nodes:
            raise RuntimeError(f"the registry kept {kept} of {nodes} reports")
        service = Service(router)
        driver = Driver(service)
        tap.listener = driver
        running = asyncio.create_task(service.run())
        admin = connect_counted_redis(settings.redis_url)
        try:
            if warmup:
                await driver.closed_loop(warmup, min(8, max(concurrency)))
            if profile is not None:
                profile.enable()
            for c in concurrency:
                row = (await run_case(driver, tap, admin, tasks, c)).row()
                rows.append(row)
                report(row)
        finally:
            if profile is not None:
                profile.disable()
            service.stop()
            await running
            await admin.aclose()

    await with_router(settings, publish, run)
    return rows
