"""The Titan replay: each GPU failure of the window injected on its node, time-compressed,
and the offline needs the services raised against them."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bench.common import percentile
from bench.fleet_sim import FleetSim
from bench.trace_replay.figures import (
    Attribution,
    Injection,
    attribute,
    compressed_env,
    silent_transitions,
)
from bench.trace_replay.stack import CLUSTER, Seen, Stack, sleep_until, stack
from bench.trace_replay.traces import (
    TITAN_FILE,
    TitanEvent,
    clamp_pct,
    node_offsets,
    read_titan,
    titan_faults,
    trace_time,
)
from common.signing import verifier_from_files
from schemas.events.v1 import OpsNeed


@dataclass(frozen=True)
class Window:
    """The trace window, its events, and how it is compressed onto the real clock."""

    start: datetime
    events: list[TitanEvent]
    factor: float        # real seconds per trace second
    interval: float      # report interval, real seconds
    settings: dict[str, str]
    failing: list[str]
    nodes: list[str]

    @property
    def ttl_s(self) -> float:
        return float(self.settings["ANALYZER_OPEN_NEED_TTL_S"])

    @classmethod
    def build(cls, args: argparse.Namespace) -> Window:
        start = trace_time(args.titan_start)
        events = read_titan(args.traces / TITAN_FILE, start, args.titan_days)
        if not events:
            raise SystemExit(f"no Titan events in {args.titan_days} days from "
                             f"{args.titan_start}")
        factor = args.titan_seconds / (args.titan_days * 86_400.0)
        settings = compressed_env(factor, 1.0, args.titan_interval, args.suspect_after)
        failing = sorted({e.node for e in events})
        nodes = failing + [f"titan-bg-{i:04d}" for i in range(args.titan_background)]
        if len(nodes) > args.titan_max_nodes:
            raise SystemExit(f"{len(nodes)} nodes > --titan-max-nodes {args.titan_max_nodes}; "
                             "shorten the window")
        return cls(start, events, factor, args.titan_interval, settings, failing, nodes)


async def replay_titan(args: argparse.Namespace, bootstrap: str,
                       redis_url: str) -> dict[str, Any]:
    started = time.monotonic()
    window = Window.build(args)
    offsets = node_offsets(window.nodes, args.jitter_pct, args.seed)
    injected: dict[str, Injection] = {}

    async with stack(bootstrap, redis_url, "titan", window.nodes, window.settings,
                     args.keep) as run:
        # A steady, mid-range load: only fault data should raise anything in this replay.
        sim = FleetSim(bootstrap, run.namespace, CLUSTER, window.nodes,
                       interval_s=window.interval,
                       verifier=verifier_from_files(run.trusted_keys),
                       report_master=run.report_master)
        for node in window.nodes:
            sim.set_load(node, clamp_pct(args.titan_load_pct + offsets[node]))
        await sim.start()
        try:
            ready_s = await run.wait_ready(len(window.nodes), args.ready_timeout)
            t0 = time.time()
            await _inject(args, run, sim, window, t0, injected)
            await _drain(args, run, sim, window, injected)
            run.check()
        finally:
            await sim.stop()
        seen = run.tap.seen
        namespace = run.namespace
        consumer_lag = run.lag.summary()

    return {
        "scenario": "titan",
        "trace": TITAN_FILE,
        "namespace": namespace,
        "window": [f"{window.start:%Y-%m-%d %H:%M}",
                   f"{window.start + timedelta(days=args.titan_days):%Y-%m-%d %H:%M}"],
        "real_seconds": args.titan_seconds,
        "trace_seconds_per_real_second": round(1.0 / window.factor),
        "nodes": len(window.nodes), "failing_nodes": len(window.failing),
        "report_interval_s": window.interval, "fault_reports": args.fault_reports,
        "settings": window.settings,
        **_detection(args, window, injected, seen, sim),
        "fleet": vars(sim.stats),
        "silent_transitions": silent_transitions(seen.states, t0),
        "consumer_lag": consumer_lag,
        "ready_s": round(ready_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }


async def _inject(args: argparse.Namespace, run: Stack, sim: FleetSim, window: Window,
                  t0: float, injected: dict[str, Injection]) -> None:
    """Each event on its node at its compressed time, for --fault-reports reports."""
    for i, event in enumerate(window.events):
        await sleep_until(t0 + (event.at - window.start).total_seconds() * window.factor)
        tag = f"e{i}"
        first = not any(a.tag is not None for a in sim.nodes[event.node].faults)
        for fault in titan_faults(event):
            sim.add_fault(event.node, fault, reports=args.fault_reports, tag=tag)
        injected[tag] = Injection(tag, event.node, event.event, time.time(), first)
        sim.check()
        run.check()
    await sleep_until(t0 + args.titan_seconds)


async def _drain(args: argparse.Namespace, run: Stack, sim: FleetSim, window: Window,
                 injected: dict[str, Injection]) -> None:
    """The last injection needs its faulty reports sent and carried through; a loaded
    pipeline takes longer, so wait (up to a limit) until every failure is answered by a
    need, rather than call a late need a miss."""
    await asyncio.sleep(args.fault_reports * window.interval + args.drain)
    deadline = time.monotonic() + args.drain_timeout
    while time.monotonic() < deadline:
        if not _attribute(args, window, injected, run.tap.seen, sim).missed:
            break
        run.check()
        await asyncio.sleep(0.5)


def _offline(seen: Seen) -> list[OpsNeed]:
    return [n for n in seen.needs if n.kind == "offline"]


def _attribute(args: argparse.Namespace, window: Window, injected: dict[str, Injection],
               seen: Seen, sim: FleetSim) -> Attribution:
    return attribute(list(injected.values()),
                     [(n, seen.need_arrived[str(n.event_id)]) for n in _offline(seen)],
                     sim.faulty_reports, window.ttl_s,
                     args.fault_reports * window.interval + 1.0)


def _stat(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 3) if values else None


def _detection(args: argparse.Namespace, window: Window, injected: dict[str, Injection],
               seen: Seen, sim: FleetSim) -> dict[str, Any]:
    """Which failures got an offline need, how soon, and what else was raised."""
    offline = _offline(seen)
    found = _attribute(args, window, injected, seen, sim)
    detected = [i for i in injected.values() if i.tag in found.need_at]
    # Delays over first failures only: a repeat lands in reports already carrying a fault,
    # and its "delay" would measure how late in that episode it came, not detection.
    firsts = [i for i in detected if i.first]
    delays = [found.need_at[i.tag] - i.at for i in firsts]
    from_report = [found.need_at[i.tag] - sim.first_sent[i.tag] for i in firsts
                   if i.tag in sim.first_sent]
    return {
        "failures_injected": len(injected),
        "injected_by_class": dict(Counter(i.event for i in injected.values())),
        "first_failures": sum(1 for i in injected.values() if i.first),
        "repeat_failures": sum(1 for i in injected.values() if not i.first),
        "offline_needs": len(offline),
        "offline_needs_untraced": found.untraced,
        "untraced_need_nodes": len(found.untraced_nodes),
        "failing_nodes_with_need": len({n.target for n in offline} & set(window.failing)),
        "failures_with_need": len(detected),
        "first_failures_with_need": len(firsts),
        "detected_by_class": dict(Counter(i.event for i in detected)),
        "failures_covered_by_open_need": len(found.covered),
        "failures_missed": len(found.missed),
        "need_action_classes": dict(Counter(n.action_class or "none" for n in offline)),
        "need_levels": dict(Counter(n.level for n in offline)),
        "other_needs": dict(Counter(n.kind for n in seen.needs if n.kind != "offline")),
        "delay_injection_to_need_s": {"p50": _stat(delays, 0.5), "p99": _stat(delays, 0.99),
                                      "max": round(max(delays), 3) if delays else None},
        "delay_first_report_to_need_s": {"p50": _stat(from_report, 0.5),
                                         "p99": _stat(from_report, 0.99)},
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
