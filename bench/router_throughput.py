"""Router throughput on the real Redis and broker: how many ML tasks/s does one instance route?

One router, built as services/router/app.py builds it (its settings, a real Kafka broker for
its publishes, the registry and statistics in the real Redis), is given a cluster of 8 nodes
serving 5 model versions each (registered through the registry's own `apply`, with
NodeReports). It is driven as the service's subscribers drive it: submissions go through
`Router.on_submitted` and answers through `Router.on_result`, each consumer one message at
a time (a FastStream subscriber's default), a TransientError retried after the dead-letter
middleware's delays; the sweep runs beside every `sweep_interval_s`. The router's bus
publishes every event to the broker (and waits for its ack, as in production) and tells the
benchmark when a command or a final outcome went out. The simulated agents answer every
published run_inference command at once, successfully (no agent processes, nothing
consumed from Kafka); a command published again is answered again, marked duplicate, as the
agent answers from its journal.

Per concurrency C (tasks in flight), two runs of N tasks each:

* waves: C tasks submitted at once, the agents keeping their answers until every one of
  them was dispatched (decision + dispatch), then the C answers at once until every final
  outcome went out (conclude + statistics): submissions/s and results/s;
* closed loop: C tasks in flight, a new one as each ends: end-to-end tasks/s, and the
  latency per task inside the router (from the submission's arrival at the router to its
  final outcome's publish, queueing in the router's consumers included; the agent answers
  at once), p50 and p99.

An attempt still unanswered after `attempt_timeout_s` (3 s) times out and is retried, as in
production, and its retry answered too: the figures count such timeouts, tasks that did not
succeed, commands published twice and handler errors (an overloaded or racing router).

Redis commands per task are INFO commandstats deltas over the closed loop (server side, so
commands run inside scripts count; other clients of a shared server count too), beside the
commands and round trips the router's own connection sent (counted client side).
A warm-up (default 400 tasks at C=8) runs first, so arms are past their cold phase.

Run: `python -m bench.router_throughput` (--tasks, --concurrency, --profile FILE).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import platform
import pstats
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, cast
from uuid import UUID, uuid4

from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.typing import EncodableT

from bench.common import exit_cleanly_on_sigterm, percentile
from schemas.envelope import Envelope
from schemas.events.v1 import (
    Command,
    CommandPayload,
    CommandResult,
    InferenceOutput,
    MlTaskOutcome,
    MlTaskSubmitted,
    ModelSelected,
    NodeReport,
    RunInference,
    ServedModel,
    now_utc,
)
from schemas.topics import Topic
from services.router.handlers import Router
from services.router.registry import Registry
from services.router.settings import RouterSettings
from services.router.stats_store import StatsStore
from services.shared.errors import TransientError
from services.shared.messaging import EventBus
from services.shared.redis_client import Keys
from services.shared.registry import register_nodes
from services.shared.signing import CommandSigner, unb64url
from tests.contracts.examples import DIGIT, examples

# A message one of the driver's queues carries to the router.
M = TypeVar("M")

CLUSTER = "bench"
TASK_TYPE = "digits"
# (model, version, family): 5 model versions on every node.
MODELS: tuple[tuple[str, str, str], ...] = (
    ("digits-logreg", "1", "logreg"), ("digits-logreg", "2", "logreg"),
    ("digits-mlp", "1", "mlp"), ("digits-mlp", "2", "mlp"), ("digits-knn", "1", "knn"))
# Reports that stay fresh for the whole run (freshness: three intervals).
REPORT_INTERVAL_S = 3_600.0
WAIT_TIMEOUT_S = 60.0
# The dead-letter middleware's retries of a TransientError (DeadLetterPolicy's default).
RETRY_DELAYS_S = (1.0, 2.0, 4.0)


# ---------------------------------------------------------------- pure parts

def node_names(nodes: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(nodes)]


def served_models(models: Sequence[tuple[str, str, str]], limit: int) -> list[ServedModel]:
    return [ServedModel(task_type=TASK_TYPE, model=m, version=v, family=f, state="ready",
                        max_concurrency=limit) for m, v, f in models]


def node_reports(cluster: str, nodes: Sequence[str], models: Sequence[ServedModel],
                 at: datetime, seq: int = 1) -> list[NodeReport]:
    """One report per node, serving `models`, as an agent would send it."""
    template = examples()["node_report"]
    assert isinstance(template, NodeReport)
    return [template.model_copy(update={
        "event_id": uuid4(), "occurred_at": at, "cluster_id": cluster, "node_id": node,
        "subject": node, "source": f"agent-{node}", "seq": seq, "faults": [],
        "interval_s": REPORT_INTERVAL_S, "mode": "active", "models": list(models)})
        for node in nodes]


def submission(cluster: str, at: datetime, deadline_s: float) -> MlTaskSubmitted:
    task_id = uuid4()
    return MlTaskSubmitted(
        event_id=uuid4(), source="api", occurred_at=at, cluster_id=cluster,
        subject=str(task_id), task_id=task_id, task_type=TASK_TYPE, input=DIGIT,
        deadline=at + timedelta(seconds=deadline_s), submitted_by="bench")


def answer(command: Command, rng: random.Random, duplicate: bool = False) -> CommandResult:
    """The simulated agent's successful answer to a run_inference command (`duplicate`: to
    one it answered already, as the agent marks its cached answer)."""
    payload = CommandPayload.model_validate_json(unb64url(command.payload))
    action = payload.action
    if not isinstance(action, RunInference):
        raise ValueError(f"not a run_inference command: {action.action}")
    inference = InferenceOutput(
        task_id=action.task_id, attempt=action.attempt, task_type=action.task_type,
        model=action.model, version=action.version, latency_ms=round(rng.uniform(0.2, 2.0), 3),
        prediction=rng.randrange(10), confidence=0.99)
    return CommandResult(
        event_id=uuid4(), source=f"agent-{payload.node_id}", occurred_at=now_utc(),
        cluster_id=command.cluster_id, subject=payload.node_id,
        command_id=payload.command_id, node_id=payload.node_id, task_id=action.task_id,
        action="run_inference", outcome="succeeded", duplicate=duplicate, inference=inference)


def commandstats_delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, int]:
    """Calls per command between two INFO commandstats replies (commands that ran only)."""
    out: dict[str, int] = {}
    for name, stats in after.items():
        calls = int(stats["calls"]) - int(before.get(name, {}).get("calls", 0))
        if calls > 0:
            out[name.removeprefix("cmdstat_")] = calls
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


@dataclass
class CaseResult:
    """The figures of one concurrency."""

    concurrency: int
    tasks: int
    submit_s: float = 0.0
    result_s: float = 0.0
    closed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    waits: int = 0
    timeouts: int = 0
    failed: int = 0
    transient: int = 0
    errors: int = 0
    duplicates: int = 0
    server_cmds: dict[str, int] = field(default_factory=dict)
    client_cmds: int = 0
    round_trips: int = 0
    wave_client: tuple[int, int] = (0, 0)   # client commands: submission phase, result phase
    wave_trips: tuple[int, int] = (0, 0)    # round trips: submission phase, result phase

    def row(self) -> dict[str, Any]:
        n = self.tasks
        return {
            "concurrency": self.concurrency, "tasks": n,
            "submissions_per_s": round(rate(n, self.submit_s), 1),
            "results_per_s": round(rate(n, self.result_s), 1),
            "tasks_per_s": round(rate(n, self.closed_s), 1),
            "p50_ms": round(percentile(self.latencies_ms, 0.5), 2) if self.latencies_ms else None,
            "p99_ms": round(percentile(self.latencies_ms, 0.99), 2) if self.latencies_ms else None,
            "waits": self.waits, "timeouts": self.timeouts, "failed": self.failed,
            "duplicate_commands": self.duplicates,
            "transient_errors": self.transient, "handler_errors": self.errors,
            "redis_cmds_per_task": round(sum(self.server_cmds.values()) / n, 1),
            "client_cmds_per_task": round(self.client_cmds / n, 1),
            "round_trips_per_task": round(self.round_trips / n, 1),
            "client_cmds_per_submission": round(self.wave_client[0] / n, 1),
            "client_cmds_per_result": round(self.wave_client[1] / n, 1),
            "round_trips_per_submission": round(self.wave_trips[0] / n, 1),
            "round_trips_per_result": round(self.wave_trips[1] / n, 1),
            "server_cmds_per_task": {k: round(v / n, 2) for k, v in self.server_cmds.items()},
        }


TABLE_COLUMNS = (("C", "concurrency"), ("submissions/s", "submissions_per_s"),
                 ("results/s", "results_per_s"), ("tasks/s (closed loop)", "tasks_per_s"),
                 ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("waits", "waits"),
                 ("timeouts", "timeouts"), ("failed", "failed"),
                 ("duplicate commands", "duplicate_commands"),
                 ("Redis cmds/task (server)", "redis_cmds_per_task"),
                 ("cmds/task (client)", "client_cmds_per_task"),
                 ("round trips/task", "round_trips_per_task"))


def table(rows: Iterable[Mapping[str, Any]]) -> str:
    """The figures as a Markdown table."""
    lines = ["| " + " | ".join(title for title, _ in TABLE_COLUMNS) + " |",
             "|" + "---|" * len(TABLE_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[key]) for _, key in TABLE_COLUMNS) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- instrumentation

class ClientCount:
    """Commands and round trips sent by the connections of `CountingConnection`."""

    commands = 0
    round_trips = 0

    @classmethod
    def read(cls) -> tuple[int, int]:
        return cls.commands, cls.round_trips


class CountingConnection(Connection):
    """A redis-py connection that counts what it sends (one pipeline is one round trip)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        ClientCount.commands += 1
        return super().pack_command(*args)

    async def send_packed_command(self, command: bytes | str | Iterable[bytes],
                                  check_health: bool = True) -> None:
        ClientCount.round_trips += 1
        await super().send_packed_command(command, check_health)


def connect_counted_redis(url: str) -> Redis:
    """`services.shared.redis_client.connect_redis`, with counted connections."""
    return Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0,
                          health_check_interval=15, decode_responses=False,
                          connection_class=CountingConnection)


class Tap(EventBus):
    """The router's bus: publishes through `inner` (the real broker; None: nowhere), then
    tells `listener` about each command and final outcome, with the time it went out."""

    def __init__(self, inner: EventBus | None) -> None:
        super().__init__(inner.broker if inner is not None else cast(Any, None),
                         inner.namespace if inner is not None else "")
        self.inner = inner
        self.listener: Driver | None = None
        self.published: Counter[Topic] = Counter()
        self.waits = 0
        self.timeouts = 0

    async def publish(self, topic: Topic, event: Envelope) -> None:
        if self.inner is not None:
            await self.inner.publish(topic, event)
        at = time.perf_counter()
        self.published[topic] += 1
        if isinstance(event, ModelSelected) and event.chosen is None:
            self.waits += 1
        elif isinstance(event, MlTaskOutcome):
            self.timeouts += event.cause == "timeout"
        if self.listener is not None:
            if isinstance(event, Command):
                self.listener.commanded(at, event)
            elif isinstance(event, MlTaskOutcome) and event.final:
                self.listener.finished(at, event)


# ---------------------------------------------------------------- the run

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
    from services.shared.messaging import ensure_topics, make_broker
    from services.shared.signing import local_signer
    from services.shared.telemetry import setup_telemetry

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
                          local_signer(settings.signing_key, settings.state_dir))
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=500, help="tasks per run (per C)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--limit", type=int, default=8, help="max_concurrency per model")
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--namespace", default="bench-router")
    parser.add_argument("--profile", default="", help="write cProfile stats of the cases here")
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="cw-bench-router-")
    settings = RouterSettings(
        kafka_bootstrap_servers=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"),
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0"),
        namespace=args.namespace, cluster_id=CLUSTER, state_dir=state)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"# router throughput, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores, load average {load} before the run), "
          f"{args.nodes} nodes x {len(MODELS)} models (max_concurrency {args.limit}), "
          f"{args.tasks} tasks per run, warm-up {args.warmup}")
    profile = cProfile.Profile() if args.profile else None
    rows = await bench(settings, nodes=args.nodes, limit=args.limit, tasks=args.tasks,
                       concurrency=args.concurrency, warmup=args.warmup, profile=profile,
                       report=lambda row: print(json.dumps(row), flush=True))
    print()
    print(table(rows))
    if profile is not None:
        profile.dump_stats(args.profile)
        stats = pstats.Stats(profile, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    exit_cleanly_on_sigterm()
    asyncio.run(main())
