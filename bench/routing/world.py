"""The simulated world: models on nodes, their true success rates and latencies over time,
and the scenarios of docs/routing.md §The simulated world as lists of timed effects."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ArmSpec:
    """One model version loaded on one node."""

    model: str
    node: str
    family: str
    predecessor: str | None = None
    added_at: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.model}@{self.node}"


@dataclass(frozen=True, slots=True)
class Effect:
    """A change of the world between `start` and `end` (virtual seconds).

    kind: model_p (model's success probability := value), node_mul (node's success factor :=
    value; with `period`/`burst` only during the first `burst` s of every `period` s),
    hang (node never answers), slow (model's median latency := value s), rate (arrival rate
    multiplied by value).
    """

    kind: str
    target: str
    start: float
    end: float
    value: float = 0.0
    period: float = 0.0
    burst: float = 0.0

    def active(self, t: float) -> bool:
        if not self.start <= t < self.end:
            return False
        if self.period > 0.0:
            return (t - self.start) % self.period < self.burst
        return True


BASE_MODELS: dict[str, tuple[str, float, float]] = {
    # model: (family, success probability, median latency s)
    "A:v1": ("alpha", 0.995, 0.30),
    "B:v1": ("alpha", 0.995, 0.25),
    "C:v1": ("beta", 0.985, 0.35),
}
PLACEMENT: dict[str, tuple[str, ...]] = {
    "A:v1": ("n1", "n2", "n3"),
    "B:v1": ("n2", "n3", "n4"),
    "C:v1": ("n1", "n3", "n4"),
}


@dataclass(frozen=True)
class Scenario:
    """A workload: base world, effects, arrivals, and which arms are bad in the incident."""

    name: str
    description: str
    duration: float = 480.0
    rate: float = 5.0                       # tasks per second (Poisson)
    models: dict[str, tuple[str, float, float]] = field(
        default_factory=lambda: dict(BASE_MODELS))
    extra_arms: tuple[ArmSpec, ...] = ()    # arms added during the run (new versions)
    effects: tuple[Effect, ...] = ()
    incident: tuple[float, float] | None = None
    bad_models: frozenset[str] = frozenset()
    bad_nodes: frozenset[str] = frozenset()
    recovers: bool = False                  # the fault ends before the run does
    fault: bool = True                      # False: steady state / capacity only
    new_version: str | None = None          # the model added during the run, if any

    def arms(self, t: float) -> list[ArmSpec]:
        base = [ArmSpec(m, n, self.models[m][0]) for m, nodes in PLACEMENT.items()
                if m in self.models for n in nodes]
        return base + [a for a in self.extra_arms if a.added_at <= t]

    def all_arms(self) -> list[ArmSpec]:
        return self.arms(math.inf)

    def is_bad(self, arm: ArmSpec) -> bool:
        return arm.model in self.bad_models or arm.node in self.bad_nodes

    def _effects(self, kind: str, target: str, t: float) -> Iterable[Effect]:
        return (e for e in self.effects
                if e.kind == kind and e.target in (target, "*") and e.active(t))

    def p_model(self, model: str, t: float) -> float:
        p = self.models[model][1]
        for e in self._effects("model_p", model, t):
            p = e.value
        return p

    def p_node(self, node: str, t: float) -> float:
        p = 1.0
        for e in self._effects("node_mul", node, t):
            p *= e.value
        return p

    def hangs(self, node: str, t: float) -> bool:
        return any(True for _ in self._effects("hang", node, t))

    def median_latency(self, model: str, t: float) -> float:
        lat = self.models[model][2]
        for e in self._effects("slow", model, t):
            lat = e.value
        return lat

    def rate_at(self, t: float) -> float:
        r = self.rate
        for e in self._effects("rate", "*", t):
            r *= e.value
        return r

    def max_rate(self) -> float:
        return self.rate * max([e.value for e in self.effects if e.kind == "rate"] + [1.0])


ONSET = 120.0
END = 320.0
ATTEMPT_TIMEOUT_S = 1.0
DEADLINE_S = 3.0
LATENCY_SIGMA = 0.35


def _v2(p: float) -> tuple[dict[str, tuple[str, float, float]], tuple[ArmSpec, ...]]:
    models = dict(BASE_MODELS)
    models["A:v2"] = ("alpha", p, 0.30)
    arms = tuple(ArmSpec("A:v2", n, "alpha", predecessor="A:v1", added_at=200.0)
                 for n in ("n1", "n2", "n4"))
    return models, arms


def scenarios() -> list[Scenario]:
    """The thirteen scenarios of docs/routing.md §The simulated world, in its order."""
    best = dict(BASE_MODELS)
    best["A:v1"] = ("alpha", 0.999, 0.30)
    quiet = {"A:v1": ("alpha", 0.999, 0.30), "B:v1": ("alpha", 0.97, 0.25),
             "C:v1": ("beta", 0.97, 0.35)}
    bad_models, bad_arms = _v2(0.70)
    good_models, good_arms = _v2(0.999)
    return [
        Scenario("steady", "all arms 99.5 %, model C 98.5 %", fault=False),
        Scenario("model_degradation", "model B -> 50 % on every node for 200 s, then back",
                 effects=(Effect("model_p", "B:v1", ONSET, END, 0.5),),
                 incident=(ONSET, END), bad_models=frozenset({"B:v1"}), recovers=True),
        Scenario("best_degrades_quietly", "best model A 99.9 % -> 85 %, others 97 %",
                 models=quiet, effects=(Effect("model_p", "A:v1", ONSET, math.inf, 0.85),),
                 incident=(ONSET, 480.0), bad_models=frozenset({"A:v1"})),
        Scenario("short_outage", "best model A (99.9 %) -> 20 % for 30 s, then back",
                 models=best, effects=(Effect("model_p", "A:v1", ONSET, ONSET + 30, 0.2),),
                 incident=(ONSET, ONSET + 30), bad_models=frozenset({"A:v1"}),
                 recovers=True),
        Scenario("flaky_node", "node n3 (hosts every model) x 0.6 success from t=120",
                 effects=(Effect("node_mul", "n3", ONSET, math.inf, 0.6),),
                 incident=(ONSET, 480.0), bad_nodes=frozenset({"n3"})),
        Scenario("intermittent_node", "node n3 fails everything 5 s of every 30 s from t=120",
                 effects=(Effect("node_mul", "n3", ONSET, math.inf, 0.0, 30.0, 5.0),),
                 incident=(ONSET, 480.0), bad_nodes=frozenset({"n3"})),
        Scenario("black_hole", "node n2 hangs (every attempt times out) for 200 s",
                 effects=(Effect("hang", "n2", ONSET, END),),
                 incident=(ONSET, END), bad_nodes=frozenset({"n2"}), recovers=True),
        Scenario("slowdown", "model A median latency -> 0.8 x attempt timeout for 200 s",
                 effects=(Effect("slow", "A:v1", ONSET, END, 0.8 * ATTEMPT_TIMEOUT_S),),
                 incident=(ONSET, END), bad_models=frozenset({"A:v1"}), recovers=True),
        Scenario("new_version_bad", "A:v2 (70 %) added on n1, n2, n4 at t=200",
                 models=bad_models, extra_arms=bad_arms, incident=(200.0, 480.0),
                 bad_models=frozenset({"A:v2"}), new_version="A:v2"),
        Scenario("new_version_good", "A:v2 (99.9 %) added on n1, n2, n4 at t=200",
                 models=good_models, extra_arms=good_arms, incident=(200.0, 480.0),
                 fault=False, new_version="A:v2"),
        Scenario("low_traffic", "1 task/s; model B -> 50 % for 200 s, then back", rate=1.0,
                 effects=(Effect("model_p", "B:v1", ONSET, END, 0.5),),
                 incident=(ONSET, END), bad_models=frozenset({"B:v1"}), recovers=True),
        Scenario("all_bad", "every model -> 50 % for 200 s (panic, retry amplification)",
                 effects=(Effect("model_p", "*", ONSET, END, 0.5),), incident=(ONSET, END),
                 bad_models=frozenset(BASE_MODELS), recovers=True),
        Scenario("overload_spike", "5x arrivals for 30 s (capacity is not failure)",
                 effects=(Effect("rate", "*", ONSET, ONSET + 30, 5.0),),
                 incident=(ONSET, ONSET + 30), fault=False),
    ]


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    """P(latency <= x) for a lognormal with this median and sigma."""
    if x <= 0.0:
        return 0.0
    return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * math.sqrt(2.0))))
