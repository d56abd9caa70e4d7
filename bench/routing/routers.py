"""The routers compared: the production selector (unchanged, through a thin adapter) and
the baselines of docs/routing.md §The routers, each with the defaults read in its source."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from bench.routing.world import ATTEMPT_TIMEOUT_S, LATENCY_SIGMA, ArmSpec, lognormal_cdf
from services.router.policy import selector, stats, updates
from services.router.policy.attribution import Cause
from services.router.policy.config import SelectorConfig

if TYPE_CHECKING:
    from bench.routing.sim import Sim

WAIT = "wait"        # nothing can take the task now: ask again shortly (not an attempt)
REFUSE = "refuse"    # the router has no target ("no deployments available"): a failed attempt
Choice = ArmSpec | str
# An attempt's cause in the simulator: the policy's causes, and the router having no target.
SimCause = Cause | Literal["no_target"]

# What each simulated cause looks like to an HTTP-minded router.
STATUS: dict[SimCause, int] = {"node_fault": 503, "model_fault": 500, "timeout": 504,
                          "unknown": 500, "capacity": 429, "bad_input": 400, "no_target": 503}


@dataclass
class SimTask:
    """One task in the simulator."""

    idx: int
    arrival: float
    deadline: float
    bad_input: bool
    attempts: list[tuple[ArmSpec, SimCause]] = field(default_factory=list)
    # the production adapter's state between attempts
    task: selector.Task | None = None


def policy_cause(cause: SimCause) -> Cause:
    """The cause the production policy hears: having no target counts as unknown."""
    return "unknown" if cause == "no_target" else cause


class Router:
    """The plug-in interface: choose, hear about dispatches and outcomes."""

    name = "router"
    faithful = ""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.flaps = 0        # quarantines / ejections / cooldowns / breaker openings
        self.panics = 0       # panic routing or "no target" answers

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        raise NotImplementedError

    def on_dispatch(self, task: SimTask, arm: ArmSpec, now: float) -> None:
        return None

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        return None

    def wants_retry(self, task: SimTask, cause: SimCause, now: float, retries_in_flight: int,
                    active: int) -> bool | None:
        """None: the harness's rule (same for every baseline)."""
        return None

    @staticmethod
    def allowed(arms: Sequence[ArmSpec], exclude: set[str]) -> list[ArmSpec]:
        """Envoy's previous_hosts predicate: skip tried arms unless nothing else is left."""
        rest = [a for a in arms if a.key not in exclude]
        return rest or list(arms)


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.i = 0

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        pool = self.allowed(arms, exclude)
        self.i += 1
        return pool[self.i % len(pool)]


class RandomRouter(Router):
    name = "random"

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        return self.rng.choice(self.allowed(arms, exclude))


class LeastLatency(Router):
    """LiteLLM latency-based-routing: mean of the last 10 latencies, unseen = 0, timeouts
    append 1000, other errors not recorded, buffer 0 (argmin, ties at random)."""

    name = "least_latency"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.lat: dict[str, deque[float]] = {}

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        pool = self.allowed(arms, exclude)
        means = [(sum(q) / len(q)) if (q := self.lat.get(a.key)) else 0.0 for a in pool]
        low = min(means)
        return self.rng.choice([a for a, m in zip(pool, means, strict=True) if m <= low])

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        if cause == "ok":
            self.lat.setdefault(arm.key, deque(maxlen=10)).append(latency)
        elif cause == "timeout":
            self.lat.setdefault(arm.key, deque(maxlen=10)).append(1000.0)


class LiteLLMCooldown(Router):
    """LiteLLM simple-shuffle with cooldown v2: per-minute success/fail counts; a failure
    cools the deployment down for 5 s if it was a 429 (group > 1), or the minute's fail rate
    is > 50 % with >= 5 calls (group > 1), or 100 % with >= 1000 calls. 400s are ignored.
    All cooled down -> "No deployments available"."""

    name = "litellm_cooldown"

    def __init__(self, seed: int, cooldown_s: float = 5.0) -> None:
        super().__init__(seed)
        self.cooldown_s = cooldown_s
        self.minute: dict[str, tuple[int, int, int]] = {}   # key -> (minute, ok, fail)
        self.until: dict[str, float] = {}

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        live = [a for a in arms if self.until.get(a.key, -1.0) <= now]
        if not live:
            self.panics += 1
            return REFUSE
        return self.rng.choice(self.allowed(live, exclude))

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        m = int(now // 60)
        minute, ok, fail = self.minute.get(arm.key, (m, 0, 0))
        if minute != m:
            ok, fail = 0, 0
        status = STATUS.get(cause, 200)
        if cause == "ok":
            self.minute[arm.key] = (m, ok + 1, fail)
            return
        if status == 400:
            return
        fail += 1
        self.minute[arm.key] = (m, ok, fail)
        total = ok + fail
        group = 9  # every arm serves the task type: the group always has more than one
        cool = ((status == 429 and group > 1) or (fail == total and total >= 1000)
                or (fail / total > 0.5 and total >= 5 and group > 1))
        if cool and self.until.get(arm.key, -1.0) <= now:
            self.until[arm.key] = now + self.cooldown_s
            self.flaps += 1


@dataclass
class _Host:
    ok: int = 0
    total: int = 0
    prev_ok: int = 0
    prev_total: int = 0
    consecutive: int = 0
    ejected_at: float | None = None
    k: int = 0
    back_intervals: int = 0


class EnvoyOutlier(Router):
    """Envoy round robin with outlier detection: consecutive_5xx 5, success rate
    mu - 1.9 sigma over the previous 10 s interval (volume 100, >= 5 hosts), ejection
    min(30 s * k, 300 s), max_ejection_percent, panic below 50 % healthy."""

    name = "envoy_default"

    def __init__(self, seed: int, max_ejection_percent: float = 10.0,
                 always_eject_one_host: bool = False, name: str | None = None) -> None:
        super().__init__(seed)
        self.max_pct = max_ejection_percent
        self.always_one = always_eject_one_host
        if name:
            self.name = name
        self.hosts: dict[str, _Host] = {}
        self.next_tick = 10.0
        self.i = 0
        self.n_hosts = 1

    def _host(self, key: str) -> _Host:
        h = self.hosts.get(key)
        if h is None:
            h = self.hosts[key] = _Host()
        return h

    def _ejected(self) -> int:
        return sum(1 for h in self.hosts.values() if h.ejected_at is not None)

    def _eject(self, key: str, now: float, n_hosts: int) -> None:
        h = self._host(key)
        if h.ejected_at is not None:
            return
        active = self._ejected()
        if 100.0 * (active + 1) / n_hosts > self.max_pct and not (
                self.always_one and active == 0):
            return
        h.ejected_at = now
        h.k += 1
        h.back_intervals = 0
        self.flaps += 1

    def _tick(self, now: float, n_hosts: int) -> None:
        while self.next_tick <= now:
            t = self.next_tick
            self.next_tick += 10.0
            for h in self.hosts.values():
                h.prev_ok, h.prev_total, h.ok, h.total = h.ok, h.total, 0, 0
                if h.ejected_at is not None:
                    if t - h.ejected_at >= min(30.0 * h.k, max(300.0, 30.0)):
                        h.ejected_at = None
                        h.consecutive = 0
                elif h.k > 0:
                    h.back_intervals += 1
                    if h.back_intervals >= 1:
                        h.k -= 1
            valid = {k: 100.0 * h.prev_ok / h.prev_total for k, h in self.hosts.items()
                     if h.ejected_at is None and h.prev_total >= 100}
            if len(valid) >= 5:
                mu = sum(valid.values()) / len(valid)
                sigma = math.sqrt(sum((v - mu) ** 2 for v in valid.values()) / len(valid))
                threshold = mu - 1.9 * sigma
                for k, v in sorted(valid.items()):
                    if v < threshold:
                        self._eject(k, t, n_hosts)

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        self.n_hosts = len(arms)
        self._tick(now, len(arms))
        healthy = [a for a in arms if self._host(a.key).ejected_at is None]
        if 100.0 * len(healthy) / len(arms) < 50.0:
            self.panics += 1
            healthy = list(arms)   # panic: balance over every host
        pool = self.allowed(healthy, exclude)
        self.i += 1
        return pool[self.i % len(pool)]

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        h = self._host(arm.key)
        status = STATUS.get(cause, 200)
        if status == 400:
            return
        h.total += 1
        if cause == "ok":
            h.ok += 1
            h.consecutive = 0
            return
        if status >= 500:
            h.consecutive += 1
            if h.consecutive >= 5:
                self._eject(arm.key, now, self.n_hosts)


@dataclass
class _Breaker:
    window: deque[bool]
    state: str = "CLOSED"
    opened_at: float = 0.0
    half_open_calls: int = 0
    half_open_results: list[bool] = field(default_factory=list)


class Resilience4j(Router):
    """A resilience4j COUNT_BASED breaker per arm (window 100, min calls 100, 50 %, open
    60 s, 10 half-open calls, every exception recorded) over round robin; all open ->
    CallNotPermitted."""

    name = "r4j_default"

    def __init__(self, seed: int, min_calls: int = 100, window: int = 100,
                 name: str | None = None) -> None:
        super().__init__(seed)
        self.min_calls = min_calls
        self.window = window
        if name:
            self.name = name
        self.b: dict[str, _Breaker] = {}
        self.i = 0

    def _breaker(self, key: str) -> _Breaker:
        b = self.b.get(key)
        if b is None:
            b = self.b[key] = _Breaker(deque(maxlen=self.window))
        return b

    def _permits(self, key: str, now: float) -> bool:
        b = self._breaker(key)
        if b.state == "OPEN" and now - b.opened_at >= 60.0:
            b.state, b.half_open_calls, b.half_open_results = "HALF_OPEN", 0, []
        if b.state == "OPEN":
            return False
        return not (b.state == "HALF_OPEN" and b.half_open_calls >= 10)

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        live = [a for a in arms if self._permits(a.key, now)]
        if not live:
            self.panics += 1
            return REFUSE
        pool = self.allowed(live, exclude)
        self.i += 1
        return pool[self.i % len(pool)]

    def on_dispatch(self, task: SimTask, arm: ArmSpec, now: float) -> None:
        b = self._breaker(arm.key)
        if b.state == "HALF_OPEN":
            b.half_open_calls += 1

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        b = self._breaker(arm.key)
        failed = cause != "ok"
        if b.state == "HALF_OPEN":
            b.half_open_results.append(failed)
            if len(b.half_open_results) >= 10:
                if sum(b.half_open_results) / len(b.half_open_results) >= 0.5:
                    b.state, b.opened_at = "OPEN", now
                    self.flaps += 1
                else:
                    b.state = "CLOSED"
                    b.window.clear()
            return
        if b.state != "CLOSED":
            return
        b.window.append(failed)
        if len(b.window) >= self.min_calls and sum(b.window) / len(b.window) >= 0.5:
            b.state, b.opened_at = "OPEN", now
            self.flaps += 1


class Thompson(Router):
    """Seldon's Thompson sampling: Beta(1, 1) per arm, never decayed, every failure counts."""

    name = "thompson"

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.ab: dict[str, list[float]] = {}

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        pool = self.allowed(arms, exclude)
        best, best_theta = pool[0], -1.0
        for a in pool:
            alpha, beta = self.ab.get(a.key, (1.0, 1.0))
            theta = self.rng.betavariate(alpha, beta)
            if theta > best_theta:
                best, best_theta = a, theta
        return best

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        ab = self.ab.setdefault(arm.key, [1.0, 1.0])
        ab[0 if cause == "ok" else 1] += 1.0


class EpsilonGreedy(Router):
    """Seldon's epsilon-greedy: 0.1; the best arm by empirical success, else uniformly one
    of the others."""

    name = "eps_greedy"

    def __init__(self, seed: int, epsilon: float = 0.1) -> None:
        super().__init__(seed)
        self.eps = epsilon
        self.sn: dict[str, list[int]] = {}

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        pool = self.allowed(arms, exclude)
        values = [(s / n if n else 0.0) for s, n in (self.sn.get(a.key, (0, 0)) for a in pool)]
        top = max(values)
        best = self.rng.choice([a for a, v in zip(pool, values, strict=True) if v >= top])
        if len(pool) > 1 and self.rng.random() < self.eps:
            return self.rng.choice([a for a in pool if a is not best])
        return best

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        sn = self.sn.setdefault(arm.key, [0, 0])
        sn[0] += cause == "ok"
        sn[1] += 1


class Oracle(Router):
    """Knows every arm's true success probability now (including the chance of beating the
    attempt timeout at its current load); ties go to the least busy arm."""

    name = "oracle"

    def __init__(self, seed: int, sim: Sim) -> None:
        super().__init__(seed)
        self.sim = sim

    def p_true(self, arm: ArmSpec, now: float) -> float:
        sc = self.sim.scenario
        if sc.hangs(arm.node, now):
            return 0.0
        slow = self.sim.slowdown(arm.key)
        on_time = lognormal_cdf(ATTEMPT_TIMEOUT_S, sc.median_latency(arm.model, now) * slow,
                                LATENCY_SIGMA)
        return sc.p_node(arm.node, now) * sc.p_model(arm.model, now) * on_time

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        pool = self.allowed(arms, exclude)
        cap = [a for a in pool if self.sim.active.get(a.key, 0) < self.sim.capacity] or pool
        return max(cap, key=lambda a: (round(self.p_true(a, now), 6),
                                       -self.sim.active.get(a.key, 0), a.key))


class Production(Router):
    """The production selector, unchanged: select + commit, record, retry_plan."""

    name = "selector"

    def __init__(self, seed: int, config: SelectorConfig | None = None,
                 name: str | None = None) -> None:
        super().__init__(seed)
        self.config = config or SelectorConfig()
        if name:
            self.name = name
        self.snapshot = stats.StatsSnapshot()
        self.decision_us: list[float] = []
        self._cands: dict[tuple[str, ...], list[selector.Candidate]] = {}

    def _candidates(self, arms: Sequence[ArmSpec]) -> list[selector.Candidate]:
        sig = tuple(a.key for a in arms)
        c = self._cands.get(sig)
        if c is None:
            c = self._cands[sig] = [selector.Candidate(a.model, a.node, a.family,
                                                       predecessor=a.predecessor)
                                    for a in arms]
        return c

    def choose(self, task: SimTask, arms: Sequence[ArmSpec], now: float,
               exclude: set[str]) -> Choice:
        t = task.task or selector.Task(f"t{task.idx}", "classify", deadline=task.deadline)
        task.task = t
        d = selector.select(t, self._candidates(arms), self.snapshot, now, self.rng,
                            self.config)
        if d.status == "panic":
            self.panics += 1
        if d.model is None:
            return WAIT if d.status == "saturated" else REFUSE
        self.snapshot = selector.commit(self.snapshot, d, self.config)
        return next(a for a in arms if a.model == d.model and a.node == d.node)

    def on_outcome(self, task: SimTask, arm: ArmSpec, cause: SimCause, latency: float,
                   now: float) -> None:
        c = policy_cause(cause)
        before = self.snapshot.arms.get(stats.arm_key(arm.model, arm.node))
        self.snapshot = updates.record(
            self.snapshot, stats.Outcome(arm.model, arm.node, arm.family, c, latency,
                                         arm.predecessor), now, self.config)
        after = self.snapshot.arms[stats.arm_key(arm.model, arm.node)]
        if after.flaps > (before.flaps if before else 0):
            self.flaps += 1

    def wants_retry(self, task: SimTask, cause: SimCause, now: float, retries_in_flight: int,
                    active: int) -> bool | None:
        assert task.task is not None
        attempts = [selector.Attempt(a.model, a.node, a.family, policy_cause(c))
                    for a, c in task.attempts]
        plan = selector.retry_plan(task.task, policy_cause(cause), attempts,
                                   selector.RetryBudget(retries_in_flight, active), now=now,
                                   config=self.config)
        if plan.next_task is not None:
            task.task = plan.next_task
        return plan.retry


RouterFactory = Callable[[int, "Sim"], Router]

BASELINES: dict[str, RouterFactory] = {
    "round_robin": lambda s, sim: RoundRobin(s),
    "random": lambda s, sim: RandomRouter(s),
    "least_latency": lambda s, sim: LeastLatency(s),
    "litellm_cooldown": lambda s, sim: LiteLLMCooldown(s),
    "envoy_default": lambda s, sim: EnvoyOutlier(s),
    "envoy_tuned": lambda s, sim: EnvoyOutlier(s, 50.0, True, "envoy_tuned"),
    "r4j_default": lambda s, sim: Resilience4j(s),
    # min 10 alone changes nothing at this traffic (a 100-call window of old successes
    # keeps the rate under 50 %): the tuned breaker also looks at the last 20 calls.
    "r4j_tuned": lambda s, sim: Resilience4j(s, 10, 20, "r4j_tuned"),
    "thompson": lambda s, sim: Thompson(s),
    "eps_greedy": lambda s, sim: EpsilonGreedy(s),
}
