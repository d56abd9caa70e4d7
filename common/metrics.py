"""The one home of ClusterWarden's metrics: every instrument by name, with its unit, what it
measures and the attributes it may carry (docs/observability.md lists them with their
Prometheus names).

Code records through an `Instruments`: the process's own (`instruments()`, made on the meter
provider common/telemetry.py installs; before that, and in unit tests that install none,
recording is the OpenTelemetry API's no-op), or one made on a given meter (a test reading its
own provider). The registry bounds every series: an attribute an instrument does not declare
is dropped, and logged once, so no caller can turn a task id into a label by accident. Node
ids are declared only where a series per node is the point (routing per model and node).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from opentelemetry import metrics
from opentelemetry.util.types import AttributeValue

log = logging.getLogger("clusterwarden.metrics")

Attributes = Mapping[str, AttributeValue]
NO_ATTRIBUTES: Final[Attributes] = {}

# Seconds. Detection and routing are sub-second when healthy and tens of seconds when not;
# executor steps run from a second (a drain) to an hour (a migration).
LATENCY_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                            30.0, 60.0, 120.0)
STEP_BUCKETS_S: Final = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                         1800.0, 3600.0)


@dataclass(frozen=True)
class Spec:
    """One instrument: its name (dotted; Prometheus shows dots as underscores, with the unit
    and `_total` for counters appended), unit (UCUM; `{thing}` is a count of things) and the
    attribute keys it may carry."""

    name: str
    unit: str
    description: str
    attributes: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class CounterSpec(Spec):
    # Made at 0 when the process starts: a counter of rare events (errors) would otherwise
    # have no series until the first one, and "no data" reads as "not measured", not "none".
    zero_at_start: bool = False


@dataclass(frozen=True)
class HistogramSpec(Spec):
    buckets: tuple[float, ...] = LATENCY_BUCKETS_S


@dataclass(frozen=True)
class GaugeSpec(Spec):
    pass


def _keys(*names: str) -> frozenset[str]:
    return frozenset(names)


# ------------------------------------------------------------------ the report pipeline
COLLECTOR_REPORTS = CounterSpec(
    "warden.collector.reports", "{report}",
    "Node reports the collector read, by outcome (ok, replay, old, unknown, stale, future, "
    "dead_letter:<reason>); counted per batch.", _keys("outcome"))
REPORT_TO_STATE = HistogramSpec(
    "warden.detection.report_to_state", "s",
    "From a node's report (its timestamp) to the node-state change it caused, published.",
    _keys("state"))
FAULT_TO_NEED = HistogramSpec(
    "warden.detection.fault_to_need", "s",
    "From the observation a need was raised on (its report's timestamp) to the need, "
    "published.", _keys("kind"))
CONSUMER_LAG = GaugeSpec(
    "warden.consumer.lag", "{message}",
    "Messages of a topic not yet handed to a consumer group (high watermark minus position, "
    "summed over the partitions this process holds).", _keys("consumer_group", "topic"))
REDIS_ERRORS = CounterSpec(
    "warden.redis.errors", "{error}",
    "Redis calls that failed (conflicts of optimistic transactions and script reloads are "
    "not failures), by command and error.", _keys("command", "error"), zero_at_start=True)
BROKER_ERRORS = CounterSpec(
    "warden.broker.errors", "{error}",
    "Kafka publishes that failed, by error.", _keys("operation", "error"), zero_at_start=True)

# ------------------------------------------------------------------ pools and needs
POOL_UTILIZATION = GaugeSpec(
    "warden.pool.utilization", "%",
    "A pool's utilisation at the analyzer's last pool period: measure gpu (mean of its up "
    "nodes), effective (with storage and queued demand weighed in), demand.",
    _keys("cluster", "pool", "measure"))
POOL_RANGE = GaugeSpec(
    "warden.pool.range", "%",
    "The thresholds of a pool's utilisation range (bound low_enter, low_exit, high_exit, "
    "high_enter): a value out past *_enter for the hold is a need.",
    _keys("cluster", "pool", "bound"))
POOL_NODES = GaugeSpec(
    "warden.pool.nodes", "{node}", "A pool's nodes by state.", _keys("cluster", "pool", "state"))
NEEDS = CounterSpec(
    "warden.analyzer.needs", "{need}",
    "Needs raised (new ones, not those already open), by kind and level.",
    _keys("kind", "level"))

# ------------------------------------------------------------------ tasks
TASK_TRANSITIONS = CounterSpec(
    "warden.tasks.transitions", "{transition}",
    "Task transitions the task store recorded (each once, however often delivered), by the "
    "state entered and the task's template (unknown until its plan arrived).",
    _keys("state", "template"))
TASKS_OPEN = GaugeSpec(
    "warden.tasks.open", "{task}",
    "Tasks not finished, by state and template, as the task store has them.",
    _keys("state", "template"))
STEP_DURATION = HistogramSpec(
    "warden.executor.step.duration", "s",
    "From a step's attempt starting to its end, by action and outcome (completed, failed).",
    _keys("action", "outcome"), buckets=STEP_BUCKETS_S)

# ------------------------------------------------------------------ limits
BREAKERS = GaugeSpec(
    "warden.scheduler.breakers", "{breaker}",
    "Circuit breakers by state (CLOSED, OPEN, HALF_OPEN, unreadable), kind and scope.",
    _keys("cluster", "kind", "scope", "state"))
BUDGET_CAPACITY = GaugeSpec(
    "warden.scheduler.budget.capacity", "{node}",
    "How many nodes of a pool its offline budget lets be out at once now.",
    _keys("cluster", "pool"))
BUDGET_IN_FLIGHT = GaugeSpec(
    "warden.scheduler.budget.in_flight", "{node}",
    "The pool's budgeted tasks in flight: the part of the budget in use.",
    _keys("cluster", "pool"))
RATE_LIMIT_TOKENS = GaugeSpec(
    "warden.scheduler.rate_limit.tokens", "{token}",
    "Tokens in a rate-limited kind's bucket (one per disruptive task started).",
    _keys("cluster", "kind"))

# ------------------------------------------------------------------ ML routing
ROUTING_ATTEMPTS = CounterSpec(
    "warden.router.attempts", "{attempt}",
    "Ended attempts of ML tasks by model, version, node and outcome (ok or the cause).",
    _keys("model", "version", "node", "outcome"))
ROUTING_LATENCY = HistogramSpec(
    "warden.router.attempt.duration", "s",
    "From the router's decision to the attempt's end, by model, version and node.",
    _keys("model", "version", "node"))

# ------------------------------------------------------------------ the edges
AGENT_REPORTS = CounterSpec(
    "warden.agent.reports", "{report}",
    "Reports an agent published (its failed publishes are broker errors).")
AGENT_COMMANDS = CounterSpec(
    "warden.agent.commands", "{command}",
    "Commands an agent answered, by action and outcome.", _keys("action", "outcome"))
API_AUTH_REFUSALS = CounterSpec(
    "warden.api.auth_refusals", "{refusal}", "Refused authentications of the API by reason.",
    _keys("reason"))

SPECS: Final[tuple[Spec, ...]] = (
    COLLECTOR_REPORTS, REPORT_TO_STATE, FAULT_TO_NEED, CONSUMER_LAG, REDIS_ERRORS,
    BROKER_ERRORS, POOL_UTILIZATION, POOL_RANGE, POOL_NODES, NEEDS, TASK_TRANSITIONS,
    TASKS_OPEN, STEP_DURATION, BREAKERS, BUDGET_CAPACITY, BUDGET_IN_FLIGHT, RATE_LIMIT_TOKENS,
    ROUTING_ATTEMPTS, ROUTING_LATENCY, AGENT_REPORTS, AGENT_COMMANDS, API_AUTH_REFUSALS,
)


class _Bounded:
    """What every instrument shares: its spec, and the attributes it keeps."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._warned: set[str] = set()

    def bounded(self, attributes: Attributes) -> Attributes:
        """`attributes` without the keys the spec does not declare (the common case, all
        declared, costs one subset test)."""
        if attributes.keys() <= self.spec.attributes:
            return attributes
        extra = sorted(attributes.keys() - self.spec.attributes)
        new = [key for key in extra if key not in self._warned]
        if new:
            self._warned.update(new)
            log.warning("metric %s: attribute(s) %s not declared; dropped", self.spec.name,
                        ", ".join(new))
        return {k: v for k, v in attributes.items() if k in self.spec.attributes}


class Counter(_Bounded):
    def __init__(self, spec: CounterSpec, meter: metrics.Meter) -> None:
        super().__init__(spec)
        self._counter = meter.create_counter(spec.name, unit=spec.unit,
                                             description=spec.description)

    def add(self, amount: int | float, attributes: Attributes = NO_ATTRIBUTES) -> None:
        self._counter.add(amount, self.bounded(attributes))


class Histogram(_Bounded):
    def __init__(self, spec: HistogramSpec, meter: metrics.Meter) -> None:
        super().__init__(spec)
        self._histogram = meter.create_histogram(
            spec.name, unit=spec.unit, description=spec.description,
            explicit_bucket_boundaries_advisory=spec.buckets)

    def record(self, value: int | float, attributes: Attributes = NO_ATTRIBUTES) -> None:
        self._histogram.record(value, self.bounded(attributes))


class Gauge(_Bounded):
    """The last value set per attribute set (a sampled level: lag, tokens, states)."""

    def __init__(self, spec: GaugeSpec, meter: metrics.Meter) -> None:
        super().__init__(spec)
        self._gauge = meter.create_gauge(spec.name, unit=spec.unit,
                                         description=spec.description)

    def set(self, value: int | float, attributes: Attributes = NO_ATTRIBUTES) -> None:
        self._gauge.set(value, self.bounded(attributes))


class Instruments:
    """The registry's instruments on one meter, each made once, on first use."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._meter = meter
        self._counters: dict[str, Counter] = {}
        self._histograms: dict[str, Histogram] = {}
        self._gauges: dict[str, Gauge] = {}

    def counter(self, spec: CounterSpec) -> Counter:
        made = self._counters.get(spec.name)
        if made is None:
            made = self._counters[spec.name] = Counter(spec, self._meter)
        return made

    def histogram(self, spec: HistogramSpec) -> Histogram:
        made = self._histograms.get(spec.name)
        if made is None:
            made = self._histograms[spec.name] = Histogram(spec, self._meter)
        return made

    def gauge(self, spec: GaugeSpec) -> Gauge:
        made = self._gauges.get(spec.name)
        if made is None:
            made = self._gauges[spec.name] = Gauge(spec, self._meter)
        return made

    def start(self) -> Instruments:
        """Make the counters that start at 0 (`CounterSpec.zero_at_start`)."""
        for spec in SPECS:
            if isinstance(spec, CounterSpec) and spec.zero_at_start:
                self.counter(spec).add(0)
        return self


METER_NAME: Final = "clusterwarden"
_process_instruments: Instruments | None = None


def instruments() -> Instruments:
    """The process's instruments, on the global meter provider (the OpenTelemetry API hands
    out proxies until common/telemetry.py installs the provider, then records through it)."""
    global _process_instruments
    if _process_instruments is None:
        _process_instruments = Instruments(metrics.get_meter(METER_NAME))
    return _process_instruments
