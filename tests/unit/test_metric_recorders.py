"""Where the services record into the registry (common/metrics.py): each records what its
instrument says, once, with bounded attributes: the executor's step timer, the consumer-lag
sampler, the router's attempt outcomes, the analyzer's needs and pools, the store's task
transitions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from aiokafka.errors import IllegalStateError
from aiokafka.structs import TopicPartition
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    NumberDataPoint,
)

from common.metrics import (
    CONSUMER_LAG,
    FAULT_TO_NEED,
    NEEDS,
    POOL_NODES,
    POOL_RANGE,
    POOL_UTILIZATION,
    ROUTING_ATTEMPTS,
    ROUTING_LATENCY,
    STEP_DURATION,
    TASK_TRANSITIONS,
    Instruments,
    Spec,
)
from schemas.events.v1 import MlTaskOutcome, OpsNeed, OpsTask, TaskEvent
from services.analyzer.metrics import record_needs, record_pools
from services.analyzer.observation import PoolObservation
from services.analyzer.settings import AnalyzerSettings
from services.executor.step_timer import StepTimer
from services.router.metrics import record_published
from services.shared.consumer_lag import ConsumerLag
from services.store.task_metrics import TaskMetrics
from tests.contracts.examples import T0, example


class Recorded:
    """Instruments on a provider of the test's own, and what they hold."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.instruments = Instruments(
            MeterProvider(metric_readers=[self.reader]).get_meter("test"))

    def points(self, spec: Spec) -> dict[tuple[Any, ...], Any]:
        """The spec's points by their attribute values (in key order)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return {}
        return {tuple(v for _, v in sorted((p.attributes or {}).items())): p
                for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == spec.name for p in m.data.data_points}

    def values(self, spec: Spec) -> dict[tuple[Any, ...], float]:
        return {k: p.value for k, p in self.points(spec).items()
                if isinstance(p, NumberDataPoint)}

    def histograms(self, spec: Spec) -> dict[tuple[Any, ...], HistogramDataPoint]:
        return {k: p for k, p in self.points(spec).items() if isinstance(p, HistogramDataPoint)}


class Ticking:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_attempt_is_timed_from_its_start_to_its_end_once() -> None:
    recorded, clock = Recorded(), Ticking()
    timer = StepTimer(clock, recorded.instruments)
    task = example("ops_task", OpsTask)
    timer.started("c-1")
    clock.now += 12.5
    timer.ended(task, 0, "c-1", "completed")
    timer.ended(task, 0, "c-1", "completed")  # a duplicate answer: not timed again
    timer.ended(task, 1, "c-unknown", "failed")  # started elsewhere: not timed
    [(key, point)] = recorded.histograms(STEP_DURATION).items()
    assert key == ("drain_node", "completed")
    assert (point.count, point.sum) == (1, 12.5)


class FakeConsumer:
    def __init__(self, lags: dict[TopicPartition, tuple[int | None, int]]) -> None:
        self.lags = lags

    def assignment(self) -> set[TopicPartition]:
        return set(self.lags)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.lags[tp][0]

    async def position(self, tp: TopicPartition) -> int:
        if self.lags[tp][1] < 0:
            raise IllegalStateError("revoked")
        return self.lags[tp][1]


class FakeSubscriber:
    def __init__(self, group: str, consumer: FakeConsumer) -> None:
        self.group_id, self.consumer = group, consumer


class FakeBroker:
    def __init__(self, *subscribers: FakeSubscriber) -> None:
        self.subscribers = list(subscribers)


async def test_consumer_lag_is_summed_per_group_and_topic_and_zero_once_gone() -> None:
    recorded = Recorded()
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    consumer = FakeConsumer({a0: (10, 4), a1: (7, 7), b0: (None, 0)})
    broker = FakeBroker(FakeSubscriber("g1", consumer), FakeSubscriber("g2", FakeConsumer({
        TopicPartition("c", 0): (5, -1)})))
    lag = ConsumerLag(broker, recorded.instruments)  # type: ignore[arg-type]
    await lag.sample()
    # b: no high watermark fetched yet; c: revoked meanwhile: both count 0.
    assert recorded.values(CONSUMER_LAG) == {("g1", "a"): 6, ("g1", "b"): 0, ("g2", "c"): 0}
    consumer.lags = {}  # rebalanced away
    await lag.sample()
    assert recorded.values(CONSUMER_LAG)[("g1", "a")] == 0


def test_an_attempts_outcome_is_counted_per_model_and_node_with_its_duration() -> None:
    recorded = Recorded()
    outcome = example("ml_task_outcome", MlTaskOutcome)
    record_published(outcome, recorded.instruments)
    record_published(outcome.model_copy(update={
        "outcome": "failed", "cause": "model_fault", "final": False, "state": "running",
        "latency_ms": None}), recorded.instruments)
    record_published(outcome.model_copy(update={"model": None, "node_id": None}),
                     recorded.instruments)  # never sent anywhere: nothing to count against
    record_published(example("ops_need", OpsNeed), recorded.instruments)  # not an outcome
    # (model, node, outcome, version)
    assert recorded.values(ROUTING_ATTEMPTS) == {
        ("digits-mlp", "node-002", "ok", "2"): 1, ("digits-mlp", "node-002", "model_fault", "2"): 1}
    [(key, point)] = recorded.histograms(ROUTING_LATENCY).items()
    assert key == ("digits-mlp", "node-002", "2")
    assert point.sum == 0.0215


def test_needs_are_counted_by_kind_and_timed_from_their_newest_evidence() -> None:
    recorded = Recorded()
    need = example("ops_need", OpsNeed)
    record_needs([need], T0 + timedelta(seconds=3), recorded.instruments)
    assert recorded.values(NEEDS) == {("offline", "node"): 1}
    [(key, point)] = recorded.histograms(FAULT_TO_NEED).items()
    assert (key, point.sum) == (("offline",), 3.0)


def test_a_pool_shows_its_utilisation_its_range_and_every_node_state() -> None:
    recorded = Recorded()
    pool = PoolObservation(cluster_id="c", pool="p", nodes_by_state={"up": 3, "down": 1},
                           gpu_utilization_pct=60.0, demand_pct=10.0, observed_at=T0)
    record_pools([pool], AnalyzerSettings(), recorded.instruments)
    # (cluster, measure, pool)
    assert recorded.values(POOL_UTILIZATION) == {("c", "gpu", "p"): 60.0,
                                                 ("c", "effective", "p"): 70.0,
                                                 ("c", "demand", "p"): 10.0}
    # (bound, cluster, pool): the default range, 20-80 % left at 25/75 %.
    assert recorded.values(POOL_RANGE) == {("low_enter", "c", "p"): 20.0,
                                           ("low_exit", "c", "p"): 25.0,
                                           ("high_exit", "c", "p"): 75.0,
                                           ("high_enter", "c", "p"): 80.0}
    nodes = recorded.values(POOL_NODES)
    assert nodes[("c", "p", "up")] == 3
    assert nodes[("c", "p", "offline")] == 0
    assert len(nodes) == 5


def test_only_a_change_of_the_tasks_own_state_is_a_transition() -> None:
    recorded = Recorded()
    metrics = TaskMetrics(recorded.instruments)
    step_event = example("task_event", TaskEvent)  # a step completed: still running
    metrics.recorded(step_event, "offline.v1")
    metrics.recorded(step_event.model_copy(update={"state": "succeeded"}), "offline.v1")
    metrics.recorded(step_event.model_copy(update={"state": "created", "previous_state": None}),
                     None)
    assert recorded.values(TASK_TRANSITIONS) == {("succeeded", "offline.v1"): 1,
                                                 ("created", "unknown"): 1}
