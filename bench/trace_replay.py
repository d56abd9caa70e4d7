"""Trace replay: real cluster traces through the real collector and analyzer processes.

Two replays, each in its own namespace with its own collector and analyzer processes on the
real broker and Redis, driven by an in-process simulated fleet (bench/fleet_sim.py) that
speaks the real protocol (registered nodes, strict reports, signed probes answered):

* philly: the Philly per-minute busy/total GPU node series (Microsoft Philly trace, CC BY
  4.0, as published per minute by the Helios authors in S-Lab-System-Group/HeliosArtifact,
  MIT). A fleet of --nodes nodes (scaled down from the trace's `total`) is kept busy in the
  trace's `active/total` proportion minute by minute: busy nodes report --busy-pct GPU
  utilisation, idle ones --idle-pct (each node with a fixed offset of up to +/- --jitter-pct).
  Counts the scale_out / scale_in / load_balance needs and the trace minute each was raised
  in, beside the pool utilisation the analyzer published.
* titan: GPU failure events of ORNL's Titan (derived from olcf/TitanGPULife, data of
  Ostrouchov et al., "GPU Lifetimes on Titan Supercomputer: Survival Analysis and
  Reliability", SC '20; please cite it). Each event of the window is injected on the
  simulated node of the same name, time-compressed, for --fault-reports reports: a DBE
  (double-bit ECC error) as XID 48 plus an uncorrected ECC error, an OTB (GPU off the bus)
  as XID 79. Counts the offline needs raised against the failures injected, and the delay
  from injection to need (p50/p99).

Time is compressed; report timestamps stay real (the collector's clock checks pass), and the
analyzer's hold periods and open-need lifetime are scaled by the same factor through its
environment (ANALYZER_*__HOLD_S, ANALYZER_OPEN_NEED_TTL_S). Every process started here is
stopped on exit, on SIGTERM and on errors. Run: `python -m bench.trace_replay` (see --help);
figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import logging
import math
import os
import platform
import random
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from bench.common import percentile
from bench.fleet_sim import FaultyReport, FleetSim, drop_namespace
from schemas.envelope import Envelope
from schemas.events.v1 import Fault, NodeState, OpsNeed, PoolHealth
from schemas.topics import Topic, topic_name
from services.analyzer.needs.load_balance import Args as LoadBalanceArgs
from services.analyzer.needs.online import Args as OnlineArgs
from services.analyzer.needs.scale import Args as ScaleArgs
from services.analyzer.settings import AnalyzerSettings
from services.shared.messaging import ensure_topics
from services.shared.registry import register
from services.shared.signing import ensure_keypair, verifier_from_files
from warden import launcher

# Kept in the repository with their provenance (bench/traces/README.md).
DEFAULT_TRACES = Path(__file__).resolve().parent / "traces"
PHILLY_FILE = "helios/philly_node_sequence.csv"
TITAN_FILE = "titan_gpu/titan_gpu_failure_events_derived.csv"
CLUSTER = "replay"
NEED_KINDS = ("scale_out", "scale_in", "load_balance", "offline", "online")
# NVIDIA's XIDs for the two Titan event classes: 48 is "double bit ECC error", 79 "GPU has
# fallen off the bus". The published playbook the analyzer uses reboots for 48 and replaces
# for 79.
TITAN_XID = {"DBE": 48, "OTB": 79}


# ---------------------------------------------------------------- pure: traces


def trace_time(text: str) -> datetime:
    """A trace timestamp (the traces carry no zone) on the trace's own clock, as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@dataclass(frozen=True)
class PhillyMinute:
    """One row of the Philly series: busy and all GPU nodes at one minute."""

    time: datetime
    active: int
    total: int

    @property
    def busy_fraction(self) -> float:
        return self.active / self.total if self.total > 0 else 0.0


def read_philly(path: Path, start: datetime, minutes: int) -> list[PhillyMinute]:
    """`minutes` consecutive rows from the first at or after `start`.

    Rows, not clock minutes: the series has one 10-hour gap (2017-10-25 14:00 to 10-26
    00:00), and a window across it jumps over the gap as the trace does.
    """
    out: list[PhillyMinute] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            at = trace_time(row["time"])
            if at < start:
                continue
            out.append(PhillyMinute(at, int(row["active"]), int(row["total"])))
            if len(out) == minutes:
                break
    return out


def busy_target(minute: PhillyMinute, nodes: int) -> int:
    """How many of the simulated nodes are busy: the trace's busy share of the fleet."""
    return min(nodes, max(0, round(minute.busy_fraction * nodes)))


class BusyAssigner:
    """Which nodes are busy. Sticky, as jobs are: when the busy count changes, only as many
    nodes change as must, chosen at random (seeded) among the idle or the busy ones."""

    def __init__(self, nodes: Sequence[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.idle = list(nodes)
        self.busy: list[str] = []

    def assign(self, target: int) -> tuple[list[str], list[str]]:
        """Move nodes until `target` are busy; returns (became busy, became idle)."""
        target = min(max(target, 0), len(self.idle) + len(self.busy))
        started: list[str] = []
        stopped: list[str] = []
        while len(self.busy) < target:
            node = self.idle.pop(self.rng.randrange(len(self.idle)))
            self.busy.append(node)
            started.append(node)
        while len(self.busy) > target:
            node = self.busy.pop(self.rng.randrange(len(self.busy)))
            self.idle.append(node)
            stopped.append(node)
        return started, stopped


def node_offsets(nodes: Sequence[str], jitter_pct: float, seed: int) -> dict[str, float]:
    """A fixed load offset per node, so that busy (and idle) nodes are not all identical."""
    rng = random.Random(seed + 1)
    return {n: rng.uniform(-jitter_pct, jitter_pct) for n in nodes}


def clamp_pct(value: float) -> float:
    return min(max(value, 0.0), 100.0)


@dataclass(frozen=True)
class TitanEvent:
    """One GPU failure on Titan: when, on which node, which GPU (serial), which class."""

    at: datetime
    node: str
    serial: str
    event: str


def read_titan(path: Path, start: datetime, days: float) -> list[TitanEvent]:
    """The failure events in [start, start + days), in time order."""
    end = start + timedelta(days=days)
    out: list[TitanEvent] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            at = trace_time(row["event_time"])
            if start <= at < end:
                out.append(TitanEvent(at, row["node"], row["SN"], row["event"]))
    return sorted(out, key=lambda e: e.at)


def titan_faults(event: TitanEvent) -> list[Fault]:
    """What a simulated node reports for a Titan event, as the agent reports the same fault
    seen through NVML (an XID, plus the uncorrected ECC error of a DBE)."""
    detail = f"titan {event.event} gpu {event.serial} at {event.at:%Y-%m-%d %H:%M:%S}"
    faults = [Fault(kind="xid", code=TITAN_XID[event.event], gpu_index=0, detail=detail)]
    if event.event == "DBE":
        faults.append(Fault(kind="ecc", gpu_index=0, detail=f"1 uncorrected ECC error; {detail}"))
    return faults


# ---------------------------------------------------------------- pure: figures


def minute_index(at: float, t0: float, seconds_per_minute: float) -> int:
    """The replayed trace minute a real moment falls in (negative: before the replay)."""
    return math.floor((at - t0) / seconds_per_minute)


def describe(values: Iterable[float]) -> dict[str, float] | None:
    items = list(values)
    if not items:
        return None
    return {"min": round(min(items), 2), "mean": round(statistics.fmean(items), 2),
            "max": round(max(items), 2)}


def silent_transitions(states: Iterable[NodeState], t0: float) -> dict[str, int]:
    """Nodes the collector saw as suspect or down, before and during the replay.

    No replay silences a node, so any count here is the machine not keeping up (a report
    applied later than the heartbeat allows), which the figures must be read with.
    """
    counts: Counter[str] = Counter()
    for state in states:
        if state.state in ("suspect", "down"):
            when = "warmup" if state.occurred_at.timestamp() < t0 else "window"
            counts[f"{state.state}_{when}"] += 1
    return dict(counts)


def compressed_env(factor: float, pool_period_s: float, report_interval_s: float,
                   suspect_after_intervals: float) -> dict[str, str]:
    """Service settings for a replay where one real second stands for 1/factor trace seconds.

    Hold periods and the open-need lifetime are the services' defaults times `factor` (read
    from the settings models, so they follow any change of default). The open-need lifetime
    is whole seconds, at least 1. Heartbeat thresholds are not compressed: they are loosened
    to a few report intervals so scheduling jitter on a small shared machine never reads as
    a silent node (no replay here silences a node).
    """
    ttl_default = AnalyzerSettings.model_fields["open_need_ttl_s"].default
    return {
        "ANALYZER_SCALE__HOLD_S": f"{ScaleArgs().hold_s * factor:.4f}",
        "ANALYZER_LOAD_BALANCE__HOLD_S": f"{LoadBalanceArgs().hold_s * factor:.4f}",
        "ANALYZER_ONLINE__HOLD_S": f"{OnlineArgs().hold_s * factor:.4f}",
        "ANALYZER_OPEN_NEED_TTL_S": str(max(1, round(ttl_default * factor))),
        "ANALYZER_POOL_PERIOD_S": f"{pool_period_s:.4f}",
        "COLLECTOR_SUSPECT_AFTER_INTERVALS": f"{suspect_after_intervals:g}",
        "COLLECTOR_DOWN_AFTER_S":
            f"{max(2.0, (suspect_after_intervals + 2) * report_interval_s):.3f}",
        "COLLECTOR_PROBE_PERIOD_S": "30",
        "COLLECTOR_PROBE_DEADLINE_S": "5",
    }


@dataclass(frozen=True)
class Injection:
    """One injected failure: `first` if its node was reporting no injected fault then."""

    tag: str
    node: str
    event: str
    at: float  # epoch seconds
    first: bool


@dataclass
class Attribution:
    """Which injected failures an offline need answered, and what became of the others."""

    need_at: dict[str, float] = field(default_factory=dict)  # tag -> first need's arrival
    untraced: int = 0  # offline needs not from an injected fault (e.g. a failed probe)
    untraced_nodes: set[str] = field(default_factory=set)
    covered: list[str] = field(default_factory=list)  # an open need already covered it
    missed: list[str] = field(default_factory=list)


def attribute(injections: Sequence[Injection], needs: Sequence[tuple[OpsNeed, float]],
              faulty_reports: Mapping[str, FaultyReport], open_need_ttl_s: float,
              grace_s: float) -> Attribution:
    """Trace each offline need (and when it arrived) back to the injections in its report.

    An offline need's correlation id is the event id of the report that raised it, and the
    simulator keeps the injection tags of every faulty report it sent. An injection no need
    cites is `covered` when a need on its node was raised within the open-need lifetime
    before it (or during its own faulty reports, `grace_s`): an identical open need is not
    raised again, by design. Anything else is `missed`.
    """
    out = Attribution()
    raised_on: dict[str, list[float]] = {}
    for need, arrived in needs:
        raised_on.setdefault(need.target, []).append(need.occurred_at.timestamp())
        report = faulty_reports.get(need.correlation_id or "")
        if report is None:
            out.untraced += 1
            out.untraced_nodes.add(need.target)
            continue
        for tag in report.tags:
            out.need_at[tag] = min(out.need_at.get(tag, arrived), arrived)
    for injection in injections:
        if injection.tag in out.need_at:
            continue
        if any(injection.at - open_need_ttl_s <= r <= injection.at + grace_s
               for r in raised_on.get(injection.node, [])):
            out.covered.append(injection.tag)
        else:
            out.missed.append(injection.tag)
    return out


# ---------------------------------------------------------------- the stack


@dataclass
class Seen:
    """What the replay read back from the services' output topics, with arrival times."""

    needs: list[OpsNeed] = field(default_factory=list)
    need_arrived: dict[str, float] = field(default_factory=dict)  # event id -> epoch s
    health: list[PoolHealth] = field(default_factory=list)
    states: list[NodeState] = field(default_factory=list)


class Tap:
    """Reads needs, pool health and node states of a namespace in the background."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.topics: dict[str, type[Envelope]] = {
            topic_name(Topic.OPS_NEEDS, namespace): OpsNeed,
            topic_name(Topic.OPS_POOL_HEALTH, namespace): PoolHealth,
            topic_name(Topic.OPS_NODE_STATE, namespace): NodeState,
        }
        self.seen = Seen()
        self._consumer = AIOKafkaConsumer(
            *self.topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
            enable_auto_commit=False)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self._task = asyncio.create_task(self._read(), name="tap")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    async def _read(self) -> None:
        while True:
            for records in (await self._consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    model = self.topics[record.topic]
                    event = model.model_validate_json(record.value)
                    if isinstance(event, OpsNeed):
                        self.seen.needs.append(event)
                        self.seen.need_arrived[str(event.event_id)] = time.time()
                    elif isinstance(event, PoolHealth):
                        self.seen.health.append(event)
                    elif isinstance(event, NodeState):
                        self.seen.states.append(event)

    def check(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            raise RuntimeError("tap failed") from self._task.exception()


class LagSampler:
    """The services' consumer lag (messages read but not yet committed), sampled every
    `period_s`: when a run falls behind, this says which stage did."""

    GROUPS: dict[str, Topic] = {
        "collector": Topic.NODE_REPORTS,
        "collector-probes": Topic.NODE_COMMAND_RESULTS,
        "analyzer-samples": Topic.OPS_SAMPLES,
    }

    def __init__(self, bootstrap: str, namespace: str, period_s: float = 2.0) -> None:
        self.namespace = namespace
        self.period_s = period_s
        self.samples: dict[str, list[float]] = {}
        self._admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._admin.start()
        await self._consumer.start()
        self._task = asyncio.create_task(self._sample(), name="lag-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()
        await self._admin.close()

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            for group in self.GROUPS:
                # A diagnostic: a failed sample is skipped, it never stops the run.
                with contextlib.suppress(Exception):
                    committed = await self._admin.list_consumer_group_offsets(
                        f"{self.namespace}.{group}")
                    if not committed:
                        continue
                    ends = await self._consumer.end_offsets(list(committed))
                    lag = sum(max(0, ends[tp] - meta.offset) for tp, meta in committed.items()
                              if meta.offset >= 0)
                    self.samples.setdefault(group, []).append(float(lag))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per group: the median and largest lag sampled, in messages."""
        return {group: {"p50": percentile(lags, 0.5), "max": max(lags)}
                for group, lags in self.samples.items() if lags}


@dataclass
class Stack:
    """A namespace with its collector and analyzer processes and a tap on their output."""

    namespace: str
    state: Path
    services: list[launcher.ServiceProcess]
    tap: Tap
    public_key: Path
    lag: LagSampler

    def check(self) -> None:
        dead = launcher.dead_services(self.services)
        if dead:
            raise RuntimeError(f"service(s) died: {[s.name for s in dead]}; logs in "
                               f"{self.state / 'logs'}")
        self.tap.check()

    async def wait_ready(self, nodes: int, timeout_s: float) -> float:
        """Until the analyzer publishes a pool health with every node up; returns seconds."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            self.check()
            health = self.tap.seen.health
            if health and health[-1].nodes_by_state.get("up", 0) == nodes:
                return time.monotonic() - started
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the fleet was not seen up within {timeout_s}s "
                           f"(logs in {self.state / 'logs'})")


@asynccontextmanager
async def stack(bootstrap: str, redis_url: str, label: str, nodes: Sequence[str],
                settings: dict[str, str], keep: bool) -> AsyncIterator[Stack]:
    """Topics, keys, enrolment, then the services; everything stopped on the way out."""
    namespace = f"replay{label}{uuid4().hex[:6]}"
    state = Path(tempfile.mkdtemp(prefix=f"cw-replay-{label}-"))
    env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap, "REDIS_URL": redis_url,
           "WARDEN_NAMESPACE": namespace, "WARDEN_CLUSTER_ID": CLUSTER,
           "WARDEN_STATE_DIR": str(state), "WARDEN_LOG_LEVEL": "WARNING", **settings}
    await ensure_topics(bootstrap, namespace)
    # The key pair exists before the collector starts, so the collector signs probes with
    # it and the simulated fleet can verify them.
    _, public = ensure_keypair(state / "keys")
    await register(redis_url, namespace, CLUSTER, nodes)
    services: list[launcher.ServiceProcess] = []
    tap = Tap(bootstrap, namespace)
    lag = LagSampler(bootstrap, namespace)
    try:
        services = launcher.start_services(state, env, ("collector", "analyzer"))
        await tap.start()
        await lag.start()
        yield Stack(namespace, state, services, tap, public, lag)
    finally:
        launcher.stop_services(services)
        await lag.stop()
        await tap.stop()
        if not keep:
            await drop_namespace(bootstrap, redis_url, namespace)


async def sleep_until(moment: float) -> None:
    """Sleep until an epoch time (returns at once if it has passed)."""
    delay = moment - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


# ---------------------------------------------------------------- philly


async def replay_philly(args: argparse.Namespace, bootstrap: str,
                        redis_url: str) -> dict[str, Any]:
    started = time.monotonic()
    start = trace_time(args.start)
    rows = read_philly(args.traces / PHILLY_FILE, start, args.minutes)
    if not rows:
        raise SystemExit(f"no Philly rows at or after {args.start}")
    spm = args.seconds_per_minute
    interval = args.report_interval or spm / 2
    pool_period = args.pool_period or spm / 2
    settings = compressed_env(spm / 60.0, pool_period, interval, args.suspect_after)
    nodes = [f"philly-{i:04d}" for i in range(args.nodes)]
    offsets = node_offsets(nodes, args.jitter_pct, args.seed)
    assigner = BusyAssigner(nodes, args.seed)
    busy_load = {n: clamp_pct(args.busy_pct + offsets[n]) for n in nodes}
    idle_load = {n: clamp_pct(args.idle_pct + offsets[n]) for n in nodes}
    expected: list[float] = []
    busy_counts: list[int] = []

    async with stack(bootstrap, redis_url, "philly", nodes, settings, args.keep) as run:
        sim = FleetSim(bootstrap, run.namespace, CLUSTER, nodes, interval_s=interval,
                       verifier=verifier_from_files([run.public_key]))

        def apply(minute: PhillyMinute) -> None:
            became_busy, became_idle = assigner.assign(busy_target(minute, len(nodes)))
            for node in became_busy:
                sim.set_load(node, busy_load[node])
            for node in became_idle:
                sim.set_load(node, idle_load[node])
            busy_counts.append(len(assigner.busy))
            expected.append(statistics.fmean(sim.loads()))

        for node in nodes:
            sim.set_load(node, idle_load[node])
        apply(rows[0])
        await sim.start()
        try:
            ready_s = await run.wait_ready(len(nodes), args.ready_timeout)
            t0 = time.time()
            for i, row in enumerate(rows):
                await sleep_until(t0 + i * spm)
                if i:
                    apply(row)
                sim.check()
                run.check()
            await sleep_until(t0 + len(rows) * spm + args.drain)
            run.check()
        finally:
            await sim.stop()
        seen = run.tap.seen
        namespace = run.namespace
        consumer_lag = run.lag.summary()

    needs_by_minute: dict[int, Counter[str]] = {}
    warmup: Counter[str] = Counter()
    after: Counter[str] = Counter()
    scale_needs = []
    for need in seen.needs:
        m = minute_index(need.occurred_at.timestamp(), t0, spm)
        if m < 0:
            warmup[need.kind] += 1
            m = 0
        elif m >= len(rows):
            after[need.kind] += 1
            m = len(rows) - 1
        needs_by_minute.setdefault(m, Counter())[need.kind] += 1
        if need.kind in ("scale_out", "scale_in"):
            scale_needs.append({
                "kind": need.kind, "minute": m, "trace_time": f"{rows[m].time:%Y-%m-%d %H:%M}",
                "pool_pct": round(need.evidence[0].value, 1),
            })
    observed: dict[int, list[float]] = {}
    for health in seen.health:
        m = minute_index(health.occurred_at.timestamp(), t0, spm)
        if 0 <= m < len(rows):
            observed.setdefault(m, []).append(health.effective_utilization_pct)
    totals: Counter[str] = Counter()
    for counts in needs_by_minute.values():
        totals.update(counts)
    series = [
        {"minute": i, "trace_time": f"{row.time:%Y-%m-%d %H:%M}", "active": row.active,
         "total": row.total, "busy_nodes": busy_counts[i],
         "expected_pool_pct": round(expected[i], 2),
         "observed_pool_pct": (round(statistics.fmean(observed[i]), 2)
                               if i in observed else None),
         "needs": dict(needs_by_minute.get(i, Counter()))}
        for i, row in enumerate(rows)
    ]
    return {
        "scenario": "philly",
        "trace": PHILLY_FILE,
        "namespace": namespace,
        "window": [f"{rows[0].time:%Y-%m-%d %H:%M}", f"{rows[-1].time:%Y-%m-%d %H:%M}"],
        "minutes": len(rows),
        "nodes": len(nodes),
        "trace_total_nodes": sorted({r.total for r in rows}),
        "seconds_per_minute": spm,
        "report_interval_s": interval,
        "busy_pct": args.busy_pct, "idle_pct": args.idle_pct, "jitter_pct": args.jitter_pct,
        "settings": settings,
        "needs": {k: totals.get(k, 0) for k in NEED_KINDS},
        "needs_in_warmup": dict(warmup),
        "needs_after_window": dict(after),
        "load_balance_nodes": len({n.target for n in seen.needs if n.kind == "load_balance"}),
        # How far behind the reports the analyzer evaluated them: a node need's evidence
        # carries the report's time, and the need the time it was raised.
        "report_to_load_balance_need_s": describe(
            (n.occurred_at - n.evidence[0].observed_at).total_seconds()
            for n in seen.needs if n.kind == "load_balance"),
        "scale_needs": scale_needs,
        "busy_fraction": describe(r.busy_fraction for r in rows),
        "expected_pool_pct": describe(expected),
        "observed_pool_pct": describe(v for vs in observed.values() for v in vs),
        "fleet": vars(sim.stats),
        "silent_transitions": silent_transitions(seen.states, t0),
        "consumer_lag": consumer_lag,
        "ready_s": round(ready_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "_series": series,
    }


def philly_table(result: dict[str, Any], every: int) -> list[str]:
    """A short table: one row per `every` trace minutes."""
    series: list[dict[str, Any]] = result["_series"]
    lines = ["| trace time | busy/total (trace) | busy nodes | pool % expected | "
             "pool % observed | scale_out | scale_in | load_balance |",
             "|---|---|---|---|---|---|---|---|"]
    for lo in range(0, len(series), every):
        chunk = series[lo:lo + every]
        counts: Counter[str] = Counter()
        for row in chunk:
            counts.update(row["needs"])
        seen = [r["observed_pool_pct"] for r in chunk if r["observed_pool_pct"] is not None]
        first = chunk[0]
        lines.append(
            f"| {first['trace_time']} | {first['active']}/{first['total']} | "
            f"{statistics.fmean(r['busy_nodes'] for r in chunk):.0f} | "
            f"{statistics.fmean(r['expected_pool_pct'] for r in chunk):.1f} | "
            f"{statistics.fmean(seen) if seen else float('nan'):.1f} | "
            f"{counts['scale_out']} | {counts['scale_in']} | {counts['load_balance']} |")
    return lines


# ---------------------------------------------------------------- titan


async def replay_titan(args: argparse.Namespace, bootstrap: str,
                       redis_url: str) -> dict[str, Any]:
    started = time.monotonic()
    start = trace_time(args.titan_start)
    events = read_titan(args.traces / TITAN_FILE, start, args.titan_days)
    if not events:
        raise SystemExit(f"no Titan events in {args.titan_days} days from {args.titan_start}")
    window_s = args.titan_days * 86_400.0
    factor = args.titan_seconds / window_s  # real seconds per trace second
    interval = args.titan_interval
    settings = compressed_env(factor, 1.0, interval, args.suspect_after)
    ttl_s = float(settings["ANALYZER_OPEN_NEED_TTL_S"])
    failing = sorted({e.node for e in events})
    nodes = failing + [f"titan-bg-{i:04d}" for i in range(args.titan_background)]
    if len(nodes) > args.titan_max_nodes:
        raise SystemExit(f"{len(nodes)} nodes > --titan-max-nodes {args.titan_max_nodes}; "
                         "shorten the window")
    offsets = node_offsets(nodes, args.jitter_pct, args.seed)
    injected: dict[str, Injection] = {}

    async with stack(bootstrap, redis_url, "titan", nodes, settings, args.keep) as run:
        # A steady, mid-range load: only fault data should raise anything in this replay.
        sim = FleetSim(bootstrap, run.namespace, CLUSTER, nodes, interval_s=interval,
                       verifier=verifier_from_files([run.public_key]))
        for node in nodes:
            sim.set_load(node, clamp_pct(args.titan_load_pct + offsets[node]))
        await sim.start()
        try:
            ready_s = await run.wait_ready(len(nodes), args.ready_timeout)
            t0 = time.time()
            for i, event in enumerate(events):
                await sleep_until(t0 + (event.at - start).total_seconds() * factor)
                tag = f"e{i}"
                first = not any(a.tag is not None for a in sim.nodes[event.node].faults)
                for fault in titan_faults(event):
                    sim.add_fault(event.node, fault, reports=args.fault_reports, tag=tag)
                injected[tag] = Injection(tag, event.node, event.event, time.time(), first)
                sim.check()
                run.check()
            await sleep_until(t0 + args.titan_seconds)
            # The last injection needs its faulty reports sent and carried through; a
            # loaded pipeline takes longer, so wait (up to a limit) until every failure
            # is answered by a need, rather than call a late need a miss.
            await asyncio.sleep(args.fault_reports * interval + args.drain)
            deadline = time.monotonic() + args.drain_timeout
            while time.monotonic() < deadline:
                so_far = attribute(
                    list(injected.values()),
                    [(n, run.tap.seen.need_arrived[str(n.event_id)])
                     for n in run.tap.seen.needs if n.kind == "offline"],
                    sim.faulty_reports, ttl_s, args.fault_reports * interval + 1.0)
                if not so_far.missed:
                    break
                run.check()
                await asyncio.sleep(0.5)
            run.check()
        finally:
            await sim.stop()
        seen = run.tap.seen
        namespace = run.namespace
        consumer_lag = run.lag.summary()

    offline = [n for n in seen.needs if n.kind == "offline"]
    found = attribute(list(injected.values()),
                      [(n, seen.need_arrived[str(n.event_id)]) for n in offline],
                      sim.faulty_reports, ttl_s, args.fault_reports * interval + 1.0)
    detected = [i for i in injected.values() if i.tag in found.need_at]
    # Delays over first failures only: a repeat lands in reports already carrying a fault,
    # and its "delay" would measure how late in that episode it came, not detection.
    firsts = [i for i in detected if i.first]
    delays = [found.need_at[i.tag] - i.at for i in firsts]
    from_report = [found.need_at[i.tag] - sim.first_sent[i.tag] for i in firsts
                   if i.tag in sim.first_sent]
    by_class = Counter(i.event for i in injected.values())

    def stat(values: list[float], q: float) -> float | None:
        return round(percentile(values, q), 3) if values else None

    return {
        "scenario": "titan",
        "trace": TITAN_FILE,
        "namespace": namespace,
        "window": [f"{start:%Y-%m-%d %H:%M}",
                   f"{start + timedelta(days=args.titan_days):%Y-%m-%d %H:%M}"],
        "real_seconds": args.titan_seconds,
        "trace_seconds_per_real_second": round(1.0 / factor),
        "nodes": len(nodes), "failing_nodes": len(failing),
        "report_interval_s": interval, "fault_reports": args.fault_reports,
        "settings": settings,
        "failures_injected": len(injected),
        "injected_by_class": dict(by_class),
        "first_failures": sum(1 for i in injected.values() if i.first),
        "repeat_failures": sum(1 for i in injected.values() if not i.first),
        "offline_needs": len(offline),
        "offline_needs_untraced": found.untraced,
        "untraced_need_nodes": len(found.untraced_nodes),
        "failing_nodes_with_need": len({n.target for n in offline} & set(failing)),
        "failures_with_need": len(detected),
        "first_failures_with_need": len(firsts),
        "detected_by_class": dict(Counter(i.event for i in detected)),
        "failures_covered_by_open_need": len(found.covered),
        "failures_missed": len(found.missed),
        "need_action_classes": dict(Counter(n.action_class or "none" for n in offline)),
        "need_levels": dict(Counter(n.level for n in offline)),
        "other_needs": dict(Counter(n.kind for n in seen.needs if n.kind != "offline")),
        "delay_injection_to_need_s": {"p50": stat(delays, 0.5), "p99": stat(delays, 0.99),
                                      "max": round(max(delays), 3) if delays else None},
        "delay_first_report_to_need_s": {"p50": stat(from_report, 0.5),
                                         "p99": stat(from_report, 0.99)},
        "fleet": vars(sim.stats),
        "silent_transitions": silent_transitions(seen.states, t0),
        "consumer_lag": consumer_lag,
        "ready_s": round(ready_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }


def titan_table(result: dict[str, Any]) -> list[str]:
    delays = result["delay_injection_to_need_s"]
    classes = result["injected_by_class"]
    return [
        "| failures injected (DBE/OTB) | first / repeat | failing nodes | offline needs | "
        "failing nodes with a need | failures covered by a need / open need / missed | "
        "delay p50 / p99 / max (s) | other offline needs (nodes) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {result['failures_injected']} ({classes.get('DBE', 0)}/{classes.get('OTB', 0)}) | "
        f"{result['first_failures']} / {result['repeat_failures']} | "
        f"{result['failing_nodes']} | {result['offline_needs']} | "
        f"{result['failing_nodes_with_need']} | {result['failures_with_need']} / "
        f"{result['failures_covered_by_open_need']} / {result['failures_missed']} | "
        f"{delays['p50']} / {delays['p99']} / {delays['max']} | "
        f"{result['offline_needs_untraced']} ({result['untraced_need_nodes']}) |",
    ]


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", nargs="+", default=["philly", "titan"],
                        choices=["philly", "titan"])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES,
                        help="The traces folder (default: bench/traces).")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jitter-pct", type=float, default=5.0,
                        help="Each node's fixed load offset is drawn from +-this.")
    parser.add_argument("--suspect-after", type=float, default=8.0,
                        help="COLLECTOR_SUSPECT_AFTER_INTERVALS for the replays.")
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    parser.add_argument("--drain", type=float, default=3.0,
                        help="Seconds to keep reading after the window ends.")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="titan: at most this much longer while failures lack a need.")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the namespaces' topics and Redis keys.")
    parser.add_argument("--series", action="store_true",
                        help="Also print the Philly per-minute series as JSON lines.")
    parser.add_argument("--table-every", type=int, default=20,
                        help="Trace minutes per row of the Philly table.")
    philly = parser.add_argument_group("philly")
    philly.add_argument("--start", default="2017-11-09 17:00", help="First trace minute.")
    philly.add_argument("--minutes", type=int, default=240, help="Trace minutes replayed.")
    philly.add_argument("--seconds-per-minute", type=float, default=0.5,
                        help="Real seconds per trace minute.")
    philly.add_argument("--nodes", type=int, default=100, help="Simulated fleet size.")
    philly.add_argument("--busy-pct", type=float, default=90.0)
    philly.add_argument("--idle-pct", type=float, default=5.0)
    philly.add_argument("--report-interval", type=float, default=None,
                        help="Real seconds (default: half a trace minute).")
    philly.add_argument("--pool-period", type=float, default=None,
                        help="ANALYZER_POOL_PERIOD_S (default: half a trace minute).")
    titan = parser.add_argument_group("titan")
    titan.add_argument("--titan-start", default="2016-07-01")
    titan.add_argument("--titan-days", type=float, default=30.0)
    titan.add_argument("--titan-seconds", type=float, default=60.0,
                       help="Real seconds the window is compressed into.")
    titan.add_argument("--titan-interval", type=float, default=1.0,
                       help="Report interval, real seconds.")
    titan.add_argument("--fault-reports", type=int, default=2,
                       help="Reports each injected failure stays in.")
    titan.add_argument("--titan-load-pct", type=float, default=50.0)
    titan.add_argument("--titan-background", type=int, default=0,
                       help="Healthy nodes added beside the failing ones.")
    titan.add_argument("--titan-max-nodes", type=int, default=10_000)
    return parser.parse_args(argv)


async def main() -> None:
    args = parse_args()
    # aiokafka logs every retried request as a warning or an error (a new topic briefly has
    # no partition leader, and the fetcher says so); what it cannot retry surfaces as an
    # exception, which stops the run. Keep the figures readable.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")
    # SIGTERM (e.g. from `timeout`) cancels the run, so every `finally` stops what it started.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    print(f"# trace replay, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
          f"({os.cpu_count()} cores), scenarios {' '.join(args.scenarios)}", flush=True)
    results = []
    try:
        if "philly" in args.scenarios:
            result = await replay_philly(args, bootstrap, redis_url)
            series = result.pop("_series")
            if args.series:
                for row in series:
                    print(json.dumps({"series": "philly", **row}))
            print(json.dumps(result), flush=True)
            result["_series"] = series
            results.append(result)
        if "titan" in args.scenarios:
            result = await replay_titan(args, bootstrap, redis_url)
            print(json.dumps(result), flush=True)
            results.append(result)
    except asyncio.CancelledError:
        print("# interrupted: every process started was stopped", flush=True)
        raise SystemExit(143) from None
    for result in results:
        print()
        if result["scenario"] == "philly":
            print(f"philly {result['window'][0]} .. {result['window'][1]}, {result['nodes']} "
                  f"nodes, needs {result['needs']}")
            for line in philly_table(result, args.table_every):
                print(line)
            for need in result["scale_needs"]:
                print(f"  {need['kind']} at trace {need['trace_time']} "
                      f"(minute {need['minute']}, pool {need['pool_pct']}%)")
        else:
            print(f"titan {result['window'][0]} .. {result['window'][1]}, {result['nodes']} "
                  f"nodes")
            for line in titan_table(result):
                print(line)


if __name__ == "__main__":
    asyncio.run(main())
