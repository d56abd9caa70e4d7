"""The Philly replay: the trace's busy share of the fleet, minute by minute, and the needs
and pool utilisation the services answered it with."""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.fleet_sim import FleetSim
from bench.trace_replay.figures import (
    NEED_KINDS,
    compressed_env,
    describe,
    minute_index,
    silent_transitions,
)
from bench.trace_replay.stack import CLUSTER, Seen, Stack, sleep_until, stack
from bench.trace_replay.traces import (
    PHILLY_FILE,
    BusyAssigner,
    PhillyMinute,
    busy_target,
    clamp_pct,
    node_offsets,
    read_philly,
    trace_time,
)
from common.signing import verifier_from_files
from schemas.events.v1 import JobInfo


def busy_jobs(node: str, kind: str) -> list[JobInfo]:
    """What a busy node reports running: Philly's jobs are gang-scheduled and take whole
    nodes (`whole-node`), or, to compare, one job that could move (`movable`); `none`
    reports no job at all."""
    if kind == "none":
        return []
    pinned = kind == "whole-node"
    return [JobInfo(job_id=f"{node}-job", kind="training", state="running",
                    gpu_indices=[0], gang=pinned, whole_node=pinned)]


@dataclass
class LoadPlan:
    """Which simulated nodes are busy each minute, at what load, and the pool utilisation
    that should follow (what the analyzer's published figure is compared with)."""

    nodes: list[str]
    assigner: BusyAssigner
    busy_load: dict[str, float]
    idle_load: dict[str, float]
    jobs: str = "whole-node"
    expected: list[float] = field(default_factory=list)
    busy_counts: list[int] = field(default_factory=list)

    @classmethod
    def build(cls, args: argparse.Namespace) -> LoadPlan:
        nodes = [f"philly-{i:04d}" for i in range(args.nodes)]
        offsets = node_offsets(nodes, args.jitter_pct, args.seed)
        return cls(nodes, BusyAssigner(nodes, args.seed),
                   {n: clamp_pct(args.busy_pct + offsets[n]) for n in nodes},
                   {n: clamp_pct(args.idle_pct + offsets[n]) for n in nodes}, args.jobs)

    def apply(self, sim: FleetSim, minute: PhillyMinute) -> None:
        """Set the fleet to one trace minute's busy share, moving as few nodes as must."""
        became_busy, became_idle = self.assigner.assign(busy_target(minute, len(self.nodes)))
        for node in became_busy:
            sim.set_load(node, self.busy_load[node])
            sim.set_jobs(node, busy_jobs(node, self.jobs))
        for node in became_idle:
            sim.set_load(node, self.idle_load[node])
            sim.set_jobs(node, [])
        self.busy_counts.append(len(self.assigner.busy))
        self.expected.append(statistics.fmean(sim.loads()))


async def replay_philly(args: argparse.Namespace, bootstrap: str,
                        redis_url: str) -> dict[str, Any]:
    started = time.monotonic()
    rows = read_philly(args.traces / PHILLY_FILE, trace_time(args.start), args.minutes)
    if not rows:
        raise SystemExit(f"no Philly rows at or after {args.start}")
    spm = args.seconds_per_minute
    interval = args.report_interval or spm / 2
    pool_period = args.pool_period or spm / 2
    settings = compressed_env(spm / 60.0, pool_period, interval, args.suspect_after)
    plan = LoadPlan.build(args)

    async with stack(bootstrap, redis_url, "philly", plan.nodes, settings, args.keep) as run:
        sim = FleetSim(bootstrap, run.namespace, CLUSTER, plan.nodes, interval_s=interval,
                       verifier=verifier_from_files(run.trusted_keys),
                       report_master=run.report_master)
        ready_s, t0 = await _drive(args, run, sim, plan, rows)
        seen = run.tap.seen
        namespace = run.namespace
        consumer_lag = run.lag.summary()

    needs = NeedsByMinute.count(seen, rows, t0, spm)
    return {
        "scenario": "philly",
        "trace": PHILLY_FILE,
        "namespace": namespace,
        "window": [f"{rows[0].time:%Y-%m-%d %H:%M}", f"{rows[-1].time:%Y-%m-%d %H:%M}"],
        "minutes": len(rows),
        "nodes": len(plan.nodes),
        "trace_total_nodes": sorted({r.total for r in rows}),
        "seconds_per_minute": spm,
        "report_interval_s": interval,
        "busy_pct": args.busy_pct, "idle_pct": args.idle_pct, "jitter_pct": args.jitter_pct,
        "jobs": args.jobs,
        "settings": settings,
        **needs.figures(seen),
        "busy_fraction": describe(r.busy_fraction for r in rows),
        "expected_pool_pct": describe(plan.expected),
        "observed_pool_pct": describe(v for vs in needs.observed.values() for v in vs),
        "fleet": vars(sim.stats),
        "silent_transitions": silent_transitions(seen.states, t0),
        "consumer_lag": consumer_lag,
        "ready_s": round(ready_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "_series": needs.series(rows, plan),
    }


async def _drive(args: argparse.Namespace, run: Stack, sim: FleetSim, plan: LoadPlan,
                 rows: list[PhillyMinute]) -> tuple[float, float]:
    """Replay the minutes on the fleet, then drain; returns (seconds to ready, start)."""
    spm = args.seconds_per_minute
    for node in plan.nodes:
        sim.set_load(node, plan.idle_load[node])
    plan.apply(sim, rows[0])
    await sim.start()
    try:
        ready_s = await run.wait_ready(len(plan.nodes), args.ready_timeout)
        t0 = time.time()
        for i, row in enumerate(rows):
            await sleep_until(t0 + i * spm)
            if i:
                plan.apply(sim, row)
            sim.check()
            run.check()
        await sleep_until(t0 + len(rows) * spm + args.drain)
        run.check()
    finally:
        await sim.stop()
    return ready_s, t0


@dataclass
class NeedsByMinute:
    """The needs raised and the pool utilisation published, by replayed trace minute (needs
    before the window count in its first minute, after it in its last)."""

    by_minute: dict[int, Counter[str]] = field(default_factory=dict)
    warmup: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    scale_needs: list[dict[str, Any]] = field(default_factory=list)
    observed: dict[int, list[float]] = field(default_factory=dict)

    @classmethod
    def count(cls, seen: Seen, rows: list[PhillyMinute], t0: float,
              spm: float) -> NeedsByMinute:
        out = cls()
        for need in seen.needs:
            m = minute_index(need.occurred_at.timestamp(), t0, spm)
            if m < 0:
                out.warmup[need.kind] += 1
                m = 0
            elif m >= len(rows):
                out.after[need.kind] += 1
                m = len(rows) - 1
            out.by_minute.setdefault(m, Counter())[need.kind] += 1
            if need.kind in ("scale_out", "scale_in"):
                out.scale_needs.append({
                    "kind": need.kind, "minute": m,
                    "trace_time": f"{rows[m].time:%Y-%m-%d %H:%M}",
                    "pool_pct": round(need.evidence[0].value, 1),
                })
        for health in seen.health:
            m = minute_index(health.occurred_at.timestamp(), t0, spm)
            if 0 <= m < len(rows):
                out.observed.setdefault(m, []).append(health.effective_utilization_pct)
        return out

    def figures(self, seen: Seen) -> dict[str, Any]:
        """The need counts of the result."""
        totals: Counter[str] = Counter()
        for counts in self.by_minute.values():
            totals.update(counts)
        return {
            "needs": {k: totals.get(k, 0) for k in NEED_KINDS},
            "needs_in_warmup": dict(self.warmup),
            "needs_after_window": dict(self.after),
            "load_balance_nodes": len({n.target for n in seen.needs
                                       if n.kind == "load_balance"}),
            # How far behind the reports the analyzer evaluated them: a node need's evidence
            # carries the report's time, and the need the time it was raised.
            "report_to_load_balance_need_s": describe(
                (n.occurred_at - n.evidence[0].observed_at).total_seconds()
                for n in seen.needs if n.kind == "load_balance"),
            "scale_needs": self.scale_needs,
        }

    def series(self, rows: list[PhillyMinute], plan: LoadPlan) -> list[dict[str, Any]]:
        """One row per trace minute: the trace, the fleet, and what the services saw."""
        return [
            {"minute": i, "trace_time": f"{row.time:%Y-%m-%d %H:%M}", "active": row.active,
             "total": row.total, "busy_nodes": plan.busy_counts[i],
             "expected_pool_pct": round(plan.expected[i], 2),
             "observed_pool_pct": (round(statistics.fmean(self.observed[i]), 2)
                                   if i in self.observed else None),
             "needs": dict(self.by_minute.get(i, Counter()))}
            for i, row in enumerate(rows)
        ]


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
