"""Decision overhead of the production selector: µs per select and memory per arm at 1 k arms."""

from __future__ import annotations

import json
import random
import sys
import time
import tracemalloc
from typing import TypedDict

import numpy as np

from services.router.policy import codec, selector, stats, updates
from services.router.policy.attribution import Cause


def _snapshot(models: int, nodes: int, rng: random.Random) -> stats.StatsSnapshot:
    snap = stats.StatsSnapshot()
    t = 0.0
    for m in range(models):
        for n in range(nodes):
            for _ in range(3):
                t += 0.01
                cause: Cause = "ok" if rng.random() < 0.98 else "model_fault"
                snap = updates.record(snap, stats.Outcome(f"m{m}", f"n{n}", f"f{m % 5}", cause,
                                                        0.3), t)
    return snap


class Overhead(TypedDict):
    """What one decision costs on a 1,000-arm snapshot."""

    arms: int
    candidates: int
    select_commit_us_p50: float
    select_commit_us_p99: float
    record_us_p50: float
    record_us_p99: float
    memory_bytes_per_arm: float
    flat_fields_per_arm: float
    decision_record_bytes: int
    python: str


def measure(candidates: int = 10, repeats: int = 3000) -> Overhead:
    """select() over `candidates` arms of a 1,000-arm snapshot (40 models x 25 nodes)."""
    rng = random.Random(7)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    snap = _snapshot(40, 25, rng)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    flat = codec.to_flat(snap)
    arms = len(snap.arms)
    cands = [selector.Candidate(f"m{m}", f"n{n}", f"f{m % 5}")
             for m, n in rng.sample([(m, n) for m in range(40) for n in range(25)], candidates)]
    now = 100.0
    times = []
    for i in range(repeats):
        task = selector.Task(f"t{i}", "classify", deadline=now + 3.0)
        t0 = time.perf_counter_ns()
        d = selector.select(task, cands, snap, now, i)
        snap2 = selector.commit(snap, d)
        times.append(time.perf_counter_ns() - t0)
    del snap2
    rec = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        updates.record(snap, stats.Outcome("m1", "n1", "f1", "ok", 0.3), now)
        rec.append(time.perf_counter_ns() - t0)
    us = np.array(times) / 1000.0
    rus = np.array(rec) / 1000.0
    d = selector.select(selector.Task("x", "classify"), cands, snap, now, 1)
    event_bytes = len(json.dumps(d.to_dict()))
    return {
        "arms": arms, "candidates": candidates,
        "select_commit_us_p50": float(np.percentile(us, 50)),
        "select_commit_us_p99": float(np.percentile(us, 99)),
        "record_us_p50": float(np.percentile(rus, 50)),
        "record_us_p99": float(np.percentile(rus, 99)),
        # the snapshot with its parent levels (65 of them), divided by the arms
        "memory_bytes_per_arm": (after - before) / arms,
        "flat_fields_per_arm": len(flat) / arms,
        "decision_record_bytes": event_bytes,
        "python": sys.version.split()[0],
    }
