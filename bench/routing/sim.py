"""The discrete-event simulator: one router, one scenario, one seed, a virtual clock.

Common random numbers: the arrivals, which tasks carry bad input and every attempt's luck
(node draw, model draw, latency draw, whether the failure is reported unclassified) come
from the workload's seed and are indexed by (task, attempt number), so every router meets
the same world; only its choices differ.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

from bench.routing.routers import REFUSE, WAIT, Router, RouterFactory, SimCause, SimTask
from bench.routing.world import ATTEMPT_TIMEOUT_S, DEADLINE_S, LATENCY_SIGMA, ArmSpec, Scenario

SLOTS = 4                 # concurrent executions per arm at full speed
CAPACITY = 8              # beyond this an arm rejects (capacity, counts against nobody)
SLOWDOWN = 0.5            # latency x (1 + SLOWDOWN * (active - SLOTS) / SLOTS) above SLOTS
MAX_RETRIES = 2           # the harness's rule for every baseline (same as the selector's)
BAD_INPUT_SHARE = 0.003   # tasks that fail anywhere (their failures blame nobody)
UNKNOWN_SHARE = 0.1       # failures reported without a cause
WAIT_S = 0.05             # a router that says "wait" is asked again after this
REFUSE_RETRY_S = 0.5      # a router that had no target is asked again after this
MAX_ATTEMPTS = MAX_RETRIES + 1

# What an event on the clock carries: a task's index (its arrival), a task to try again, or
# an attempt's end (task, arm, cause, latency, whether it ran on the arm).
AttemptEnd = tuple[SimTask, ArmSpec, SimCause, float, bool]
EventData = int | SimTask | AttemptEnd


@dataclass(frozen=True)
class Workload:
    """Arrivals and per-attempt draws for one (scenario, seed), shared by every router."""

    arrivals: list[float]
    bad_input: list[bool]
    u_node: list[list[float]]
    u_model: list[list[float]]
    z: list[list[float]]
    u_unknown: list[list[float]]


def workload(scenario: Scenario, seed: int) -> Workload:
    """Poisson arrivals at the scenario's rate (thinning for bursts) and the attempt draws."""
    rng = np.random.default_rng(seed)
    top = scenario.max_rate()
    n_max = int(top * scenario.duration * 1.3) + 50
    gaps = rng.exponential(1.0 / top, n_max)
    times = np.cumsum(gaps)
    keep = rng.random(n_max)
    arrivals = [float(t) for t, k in zip(times, keep, strict=True)
                if t < scenario.duration and k < scenario.rate_at(float(t)) / top]
    n = len(arrivals)
    return Workload(
        arrivals=arrivals,
        bad_input=(rng.random(n) < BAD_INPUT_SHARE).tolist(),
        u_node=rng.random((n, MAX_ATTEMPTS)).tolist(),
        u_model=rng.random((n, MAX_ATTEMPTS)).tolist(),
        z=rng.standard_normal((n, MAX_ATTEMPTS)).tolist(),
        u_unknown=rng.random((n, MAX_ATTEMPTS)).tolist())


@dataclass
class TaskLog:
    arrival: float
    ok: bool = False
    first_ok: bool = False
    finished: float = math.nan
    attempts: int = 0
    missed_deadline: bool = False


class Sim:
    """Runs one router over one workload and keeps everything the metrics need."""

    capacity = CAPACITY

    def __init__(self, scenario: Scenario, work: Workload, factory: RouterFactory,
                 router_seed: int, max_retries: int = MAX_RETRIES) -> None:
        self.scenario = scenario
        self.work = work
        self.max_retries = max_retries
        self.active: dict[str, int] = {}
        self.router: Router = factory(router_seed, self)
        self.tasks: list[TaskLog] = []
        self.dispatches: list[tuple[float, str, int]] = []   # (time, arm key, attempt no)
        self.decision_ns: list[int] = []
        self.rejects = 0
        self.max_active = 0
        self.retrying = 0
        self.peak_retrying = 0
        self.in_system = 0
        self._heap: list[tuple[float, int, int, EventData]] = []
        self._seq = 0
        self._arms_cache: tuple[float, list[ArmSpec]] | None = None

    def slowdown(self, key: str) -> float:
        extra = self.active.get(key, 0) - SLOTS
        return 1.0 + SLOWDOWN * extra / SLOTS if extra > 0 else 1.0

    def _push(self, t: float, kind: int, data: EventData) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, data))

    def _arms(self, now: float) -> list[ArmSpec]:
        # Arms only change when a new version is added: recompute at those times only.
        cached = self._arms_cache
        if cached is None or (self.scenario.extra_arms and now >= cached[0]):
            arms = self.scenario.arms(now)
            nxt = min((a.added_at for a in self.scenario.extra_arms if a.added_at > now),
                      default=math.inf)
            self._arms_cache = (nxt, arms)
            return arms
        return cached[1]

    def run(self) -> Sim:
        w = self.work
        for i, t in enumerate(w.arrivals):
            self._push(t, 0, i)
        while self._heap:
            now, _, _kind, data = heapq.heappop(self._heap)
            if isinstance(data, int):            # kind 0: an arrival
                task = SimTask(idx=data, arrival=now, deadline=now + DEADLINE_S,
                               bad_input=w.bad_input[data])
                self.tasks.append(TaskLog(arrival=now))
                self.in_system += 1
                self._try(task, now)
            elif isinstance(data, SimTask):      # kind 1: try again
                self._try(data, now)
            else:                                # kind 2: an attempt ended
                self._done(now, *data)
        return self

    def _finish(self, task: SimTask, now: float, ok: bool, missed: bool = False) -> None:
        log = self.tasks[task.idx]
        log.ok, log.finished, log.missed_deadline = ok, now, missed
        log.attempts = len(task.attempts)
        self.in_system -= 1

    def _try(self, task: SimTask, now: float) -> None:
        if now >= task.deadline:
            self._end_retry(task)
            self._finish(task, now, False, missed=True)
            return
        exclude = {a.key for a, _ in task.attempts}
        arms = self._arms(now)
        t0 = time.perf_counter_ns()
        choice = self.router.choose(task, arms, now, exclude)
        self.decision_ns.append(time.perf_counter_ns() - t0)
        if choice == WAIT:
            self._push(now + WAIT_S, 1, task)
            return
        if choice == REFUSE or isinstance(choice, str):
            self._outcome(task, None, "no_target", 0.0, now)
            return
        self._dispatch(task, choice, now)

    def _dispatch(self, task: SimTask, arm: ArmSpec, now: float) -> None:
        sc, w = self.scenario, self.work
        j = min(len(task.attempts), MAX_ATTEMPTS - 1)
        i = task.idx
        self.dispatches.append((now, arm.key, len(task.attempts)))
        self.router.on_dispatch(task, arm, now)
        active = self.active.get(arm.key, 0)
        if active >= CAPACITY:
            self.rejects += 1
            self._push(now + 0.01, 2, (task, arm, "capacity", 0.01, False))
            return
        slow = self.slowdown(arm.key)
        self.active[arm.key] = active + 1
        self.max_active = max(self.max_active, active + 1)
        timeout = min(ATTEMPT_TIMEOUT_S, task.deadline - now)
        cause: SimCause
        if sc.hangs(arm.node, now):
            cause, lat = "timeout", timeout
        else:
            lat = sc.median_latency(arm.model, now) * slow * math.exp(LATENCY_SIGMA * w.z[i][j])
            if task.bad_input:
                cause, lat = "bad_input", lat * 0.1
            elif w.u_node[i][j] >= sc.p_node(arm.node, now):
                cause, lat = "node_fault", lat * 0.5
            elif w.u_model[i][j] >= sc.p_model(arm.model, now):
                cause, lat = "model_fault", lat * 0.5
            else:
                cause = "ok"
            if lat > timeout:
                cause, lat = "timeout", timeout
            elif cause in ("node_fault", "model_fault") and w.u_unknown[i][j] < UNKNOWN_SHARE:
                cause = "unknown"
        self._push(now + lat, 2, (task, arm, cause, lat, True))

    def _done(self, now: float, task: SimTask, arm: ArmSpec, cause: SimCause, lat: float,
              ran: bool) -> None:
        if ran:
            self.active[arm.key] -= 1
        self._outcome(task, arm, cause, lat, now)

    def _end_retry(self, task: SimTask) -> None:
        if len(task.attempts) > 0:
            self.retrying -= 1

    def _outcome(self, task: SimTask, arm: ArmSpec | None, cause: SimCause, lat: float,
                 now: float) -> None:
        first = not task.attempts
        if arm is not None:
            self.router.on_outcome(task, arm, cause, lat, now)
            task.attempts.append((arm, cause))
        else:
            task.attempts.append((_NO_ARM, cause))
        if first:
            self.tasks[task.idx].first_ok = cause == "ok"
        else:
            self.retrying -= 1
        if cause == "ok":
            self._finish(task, now, True)
            return
        want = None
        if arm is not None:
            want = self.router.wants_retry(task, cause, now, self.retrying, self.in_system)
        if want is None:
            want = (cause != "bad_input" and len(task.attempts) <= self.max_retries
                    and now < task.deadline)
        else:
            want = want and len(task.attempts) <= self.max_retries and now < task.deadline
        if not want:
            self._finish(task, now, False, missed=cause == "timeout")
            return
        self.retrying += 1
        self.peak_retrying = max(self.peak_retrying, self.retrying)
        self._push(now + (REFUSE_RETRY_S if arm is None else 0.0), 1, task)


_NO_ARM = ArmSpec("-", "-", "-")
