"""The instrument registry (common/metrics.py): every instrument named, described and bounded
in one place; recording keeps only declared attributes; Prometheus shows them under the
names the dashboards and the docs use; and the pieces around it (failed-call counting, trace
ids in logs, the /metrics endpoint) do what common/observability.py says."""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, generate_latest

from common import metrics
from common.metrics import (
    BROKER_ERRORS,
    COLLECTOR_REPORTS,
    CONSUMER_LAG,
    REDIS_ERRORS,
    REPORT_TO_STATE,
    SPECS,
    CounterSpec,
    HistogramSpec,
    Instruments,
    Spec,
)
from common.observability import (
    REDIS_SCOPE,
    FailedCalls,
    MetricsSettings,
    TraceIds,
    prometheus_reader,
)
from tests.ports import free_port
from warden import launcher

ROOT = Path(__file__).resolve().parents[2]
# Attributes that would make a series per task, event or command: never a label.
UNBOUNDED = {"task_id", "event_id", "command_id", "need_id", "trace_id", "span_id"}
PER_NODE = {"warden.router.attempts", "warden.router.attempt.duration"}
UNIT_SUFFIX = {"s": "_seconds", "%": "_percent"}


def prometheus_name(spec: Spec) -> str:
    """The name Prometheus shows (the exporter's mapping: dots to underscores, the unit as
    a suffix unless it is a {count}, `_total` for counters)."""
    base = spec.name.replace(".", "_") + UNIT_SUFFIX.get(spec.unit, "")
    return base + "_total" if isinstance(spec, CounterSpec) else base


def provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader],
                         resource=Resource.create({"service.name": "test"})), reader


def points(data: MetricsData | None, name: str) -> list[Any]:
    assert data is not None
    return [point for rm in data.resource_metrics for sm in rm.scope_metrics
            for metric in sm.metrics if metric.name == name
            for point in metric.data.data_points]


# ------------------------------------------------------------------ the registry itself

def test_every_instrument_is_named_once_described_and_has_a_unit() -> None:
    names = [spec.name for spec in SPECS]
    assert len(names) == len(set(names))
    for spec in SPECS:
        assert re.fullmatch(r"warden(\.[a-z_]+)+", spec.name), spec.name
        assert spec.description.strip(), spec.name
        assert spec.unit, spec.name
        assert all(re.fullmatch(r"[a-z_]+", key) for key in spec.attributes), spec.name


def test_no_instrument_may_carry_a_label_per_task_or_per_node_but_routing() -> None:
    for spec in SPECS:
        assert not spec.attributes & UNBOUNDED, spec.name
        if "node" in spec.attributes or "node_id" in spec.attributes:
            assert spec.name in PER_NODE, f"{spec.name}: a series per node"


def test_histograms_have_increasing_buckets() -> None:
    for spec in SPECS:
        if isinstance(spec, HistogramSpec):
            assert list(spec.buckets) == sorted(set(spec.buckets)), spec.name


def test_declared_attributes_are_kept_and_undeclared_ones_dropped_once_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    meter_provider, reader = provider()
    recorded = Instruments(meter_provider.get_meter("test"))
    counter = recorded.counter(COLLECTOR_REPORTS)
    with caplog.at_level(logging.WARNING, "clusterwarden.metrics"):
        counter.add(2, {"outcome": "ok"})
        counter.add(1, {"outcome": "ok", "task_id": "t-1"})
        counter.add(1, {"outcome": "ok", "task_id": "t-2"})
    [point] = points(reader.get_metrics_data(), COLLECTOR_REPORTS.name)
    assert dict(point.attributes) == {"outcome": "ok"}
    assert point.value == 4
    warnings = [r for r in caplog.records if "task_id" in r.getMessage()]
    assert len(warnings) == 1


def test_an_instrument_is_made_once_per_registry() -> None:
    meter_provider, _ = provider()
    recorded = Instruments(meter_provider.get_meter("test"))
    assert recorded.counter(COLLECTOR_REPORTS) is recorded.counter(COLLECTOR_REPORTS)
    assert recorded.gauge(CONSUMER_LAG) is recorded.gauge(CONSUMER_LAG)
    assert metrics.instruments() is metrics.instruments()


def test_histograms_use_their_own_buckets_and_gauges_keep_the_last_value() -> None:
    meter_provider, reader = provider()
    recorded = Instruments(meter_provider.get_meter("test"))
    recorded.histogram(REPORT_TO_STATE).record(0.3, {"state": "up"})
    lag = recorded.gauge(CONSUMER_LAG)
    lag.set(7, {"consumer_group": "g", "topic": "t"})
    lag.set(3, {"consumer_group": "g", "topic": "t"})
    data = reader.get_metrics_data()
    [histogram] = points(data, REPORT_TO_STATE.name)
    assert tuple(histogram.explicit_bounds) == REPORT_TO_STATE.buckets
    [gauge] = points(data, CONSUMER_LAG.name)
    assert gauge.value == 3


def test_error_counters_exist_at_zero_from_the_start() -> None:
    meter_provider, reader = provider()
    Instruments(meter_provider.get_meter("test")).start()
    data = reader.get_metrics_data()
    for spec in (REDIS_ERRORS, BROKER_ERRORS):
        [point] = points(data, spec.name)
        assert point.value == 0


def test_prometheus_shows_every_instrument_under_its_documented_name() -> None:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    recorded = Instruments(MeterProvider(metric_readers=[reader]).get_meter("test"))
    for spec in SPECS:
        attributes = {key: "x" for key in spec.attributes}
        if isinstance(spec, CounterSpec):
            recorded.counter(spec).add(1, attributes)
        elif isinstance(spec, HistogramSpec):
            recorded.histogram(spec).record(1.0, attributes)
        else:
            recorded.gauge(spec).set(1, attributes)  # type: ignore[arg-type]
    exposed = generate_latest(registry).decode()
    for spec in SPECS:
        assert f"# TYPE {prometheus_name(spec)} " in exposed, prometheus_name(spec)


# ------------------------------------------------------------------ the registry's users

def dashboard_metric_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"):
        text = json.dumps([t["expr"] for p in json.loads(path.read_text())["panels"]
                           for t in p.get("targets", [])])
        names |= set(re.findall(r"\bwarden_[a-z_]+", text))
    return names


def test_the_dashboards_query_only_metrics_the_registry_defines() -> None:
    defined = {prometheus_name(spec) for spec in SPECS}
    suffixes = ("_bucket", "_count", "_sum")
    used = {next((n[: -len(s)] for s in suffixes if n.endswith(s) and n[: -len(s)] in defined),
                 n) for n in dashboard_metric_names()}
    assert used, "no dashboard queries a warden_ metric"
    assert used <= defined, used - defined


def test_the_prometheus_script_scrapes_the_processes_where_the_launcher_puts_them() -> None:
    script = (ROOT / "deploy" / "local" / "prometheus.sh").read_text()
    listed = re.search(r"^PROCESSES=\(([^)]*)\)", script, re.M)
    assert listed is not None
    assert tuple(listed.group(1).split()) == launcher.PROCESSES
    assert launcher.metrics_env("store", {launcher.METRICS_BASE_PORT: "19100"}) == {
        "WARDEN_METRICS_PORT": str(19100 + launcher.PROCESSES.index("store"))}
    assert launcher.metrics_env("store", {launcher.METRICS_BASE_PORT: "0"}) == {}


def test_the_docs_list_every_metric() -> None:
    docs = (ROOT / "docs" / "observability.md").read_text()
    for spec in SPECS:
        assert f"`{prometheus_name(spec)}`" in docs, prometheus_name(spec)


# ------------------------------------------------------------------ common/observability.py

def test_failed_redis_calls_and_publishes_are_counted_and_lost_races_are_not() -> None:
    meter_provider, reader = provider()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(FailedCalls(Instruments(meter_provider.get_meter("t"))))
    redis_tracer = tracer_provider.get_tracer(REDIS_SCOPE)

    class WatchError(Exception):
        pass

    for error in (ConnectionError("down"), WatchError("raced"), TimeoutError("slow")):
        with pytest.raises(type(error)), redis_tracer.start_as_current_span("EVALSHA x"):
            raise error
    with pytest.raises(OSError, match="broker gone"), tracer_provider.get_tracer(
            "faststream").start_as_current_span("t publish", kind=SpanKind.PRODUCER):
        raise OSError("broker gone")
    with tracer_provider.get_tracer("faststream").start_as_current_span("fine"):
        pass
    data = reader.get_metrics_data()
    redis = {(p.attributes["command"], p.attributes["error"]): p.value
             for p in points(data, REDIS_ERRORS.name)}
    assert redis == {("EVALSHA", "ConnectionError"): 1, ("EVALSHA", "TimeoutError"): 1}
    [broker] = points(data, BROKER_ERRORS.name)
    assert dict(broker.attributes) == {"operation": "publish", "error": "OSError"}


def ids_of(record: logging.LogRecord) -> tuple[object, object]:
    """The ids TraceIds put on a record (attributes a LogRecord does not declare)."""
    return record.__dict__["trace_id"], record.__dict__["span_id"]


def test_log_records_carry_the_trace_and_span_they_were_written_in() -> None:
    tracer = TracerProvider().get_tracer("test")
    ids = TraceIds()
    outside = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    ids.filter(outside)
    assert ids_of(outside) == ("-", "-")
    with tracer.start_as_current_span("work") as span:
        inside = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
        ids.filter(inside)
    context = span.get_span_context()
    assert ids_of(inside) == (format(context.trace_id, "032x"), format(context.span_id, "016x"))


def test_no_endpoint_without_a_port_and_one_that_closes_with_its_provider() -> None:
    assert prometheus_reader(MetricsSettings(metrics_port=0)) is None
    port = free_port()
    reader = prometheus_reader(MetricsSettings(metrics_port=port))
    assert reader is not None
    meter_provider = MeterProvider(metric_readers=[reader],
                                   resource=Resource.create({"service.name": "probe"}))
    Instruments(meter_provider.get_meter("test")).counter(COLLECTOR_REPORTS).add(
        3, {"outcome": "ok"})
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        body = answer.read().decode()
    assert re.search(r'^warden_collector_reports_total\{.*outcome="ok".*service_name="probe"'
                     r".*\} 3\.0$", body, re.M), body
    assert "process_resident_memory_bytes" in body
    meter_provider.shutdown()
    with pytest.raises(OSError, match="refused"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
