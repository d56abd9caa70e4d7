"""What every process adds to its OpenTelemetry providers (common/telemetry.py): a Prometheus
endpoint for its metrics, the instrumentation of Redis, SQLAlchemy and FastAPI, the counting
of failed Redis calls and Kafka publishes, and trace and span ids in its log lines.

The Prometheus endpoint is served on WARDEN_METRICS_HOST:WARDEN_METRICS_PORT (0: none, the
default: the demo and the tests run many processes on one machine, where one port for all
would collide). It is pulled: nothing is computed between two scrapes, so the report hot path
pays only for recording into the SDK's aggregations.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Final
from wsgiref.simple_server import WSGIServer

from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, start_http_server
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.metrics import BROKER_ERRORS, REDIS_ERRORS, Instruments, instruments

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("clusterwarden.observability")

# The health probes are answered every few seconds: as request metrics and spans they would
# drown the operators' own calls.
UNINSTRUMENTED_PATHS: Final = "livez,readyz,healthz"
# Expected exceptions of Redis calls: an optimistic transaction that lost its race is retried,
# and a script unknown to a restarted Redis is loaded and run again.
EXPECTED_REDIS_ERRORS: Final = frozenset({"WatchError", "NoScriptError"})
REDIS_SCOPE: Final = "opentelemetry.instrumentation.redis"
# OpenTelemetry's own switch (as its auto-instrumentation reads it): a comma-separated list of
# the instrumentations to leave off, e.g. "redis" where a span per Redis call costs too much.
DISABLED_INSTRUMENTATIONS: Final = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"


def enabled(library: str) -> bool:
    """Whether `library` (redis, sqlalchemy, fastapi) is to be instrumented."""
    disabled = os.getenv(DISABLED_INSTRUMENTATIONS, "")
    return library not in {name.strip() for name in disabled.split(",")}


class MetricsSettings(BaseSettings):
    """Where the process serves its metrics for Prometheus."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    metrics_port: int = Field(
        default=0, ge=0, le=65_535,
        validation_alias=AliasChoices("WARDEN_METRICS_PORT", "metrics_port"),
        description="Port of the Prometheus endpoint (/metrics); 0: not served.")
    metrics_host: str = Field(
        default="127.0.0.1",
        validation_alias=AliasChoices("WARDEN_METRICS_HOST", "metrics_host"),
        description="Listen address of the Prometheus endpoint (0.0.0.0 in a pod).")
    metrics_sample_period_s: float = Field(
        default=5.0, gt=0.0, le=3_600.0,
        validation_alias=AliasChoices("WARDEN_METRICS_SAMPLE_PERIOD_S", "metrics_sample_period_s"),
        description="How often the levels a service reads rather than records are sampled: "
                    "consumer lag, the scheduler's breakers, budgets and tokens, open tasks.")


def sample_period_s() -> float:
    """WARDEN_METRICS_SAMPLE_PERIOD_S: how often sampled gauges are read."""
    return MetricsSettings().metrics_sample_period_s


class ServedPrometheusReader(PrometheusMetricReader):
    """The Prometheus reader with its own registry and HTTP server, which its shutdown (the
    meter provider's) closes too."""

    def __init__(self, host: str, port: int) -> None:
        registry = CollectorRegistry()
        # The process's CPU, memory and file descriptors, and the collector's pauses.
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
        # service.name as a label, as the OTLP path shows it: one dashboard serves both.
        super().__init__(registry=registry,
                         resource_attribute_filter=lambda key: key == "service.name")
        self.server: WSGIServer
        self.thread: threading.Thread
        # A port taken stops the process at start, with the error: metrics it was told to
        # serve and does not are a silent gap on every dashboard.
        self.server, self.thread = start_http_server(port, host, registry)
        self.port = int(self.server.server_port)
        log.info("Prometheus metrics on %s:%d/metrics", host, self.port)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        super().shutdown(timeout_millis, **kwargs)
        self.server.shutdown()
        self.server.server_close()


def prometheus_reader(settings: MetricsSettings | None = None) -> ServedPrometheusReader | None:
    """The reader serving /metrics, if a port is set (WARDEN_METRICS_PORT)."""
    settings = settings or MetricsSettings()
    if not settings.metrics_port:
        return None
    return ServedPrometheusReader(settings.metrics_host, settings.metrics_port)


class FailedCalls(SpanProcessor):
    """Counts failed Redis calls and Kafka publishes from the spans that record them: the
    Redis instrumentation's, FastStream's and the bulk publisher's end with an error status.
    (Spans not sampled are not seen; the default sampler records every span.)"""

    def __init__(self, recorded: Instruments) -> None:
        self._redis = recorded.counter(REDIS_ERRORS)
        self._broker = recorded.counter(BROKER_ERRORS)

    def on_end(self, span: ReadableSpan) -> None:
        if span.status.status_code is not StatusCode.ERROR:
            return
        error = _exception_type(span)
        scope = span.instrumentation_scope.name if span.instrumentation_scope else ""
        if scope == REDIS_SCOPE:
            if error not in EXPECTED_REDIS_ERRORS:
                # The first word: a pipeline's span names all its commands.
                command = span.name.split(" ", 1)[0] or "unknown"
                self._redis.add(1, {"command": command, "error": error})
        elif span.kind is SpanKind.PRODUCER:
            self._broker.add(1, {"operation": "publish", "error": error})


def _exception_type(span: ReadableSpan) -> str:
    """The short class name of the exception a span recorded, or "unknown"."""
    for event in span.events:
        if event.name == "exception" and event.attributes:
            qualified = str(event.attributes.get("exception.type", "unknown"))
            return qualified.rsplit(".", 1)[-1]
    return "unknown"


# Set by `install` (a service's telemetry), so a library a unit test uses stays as it is.
_installed = False
_engine_instrumented = False


def install(tracer_provider: Any) -> None:
    """Count failed calls, instrument Redis (every client of the process, made before or
    after), and start the counters that start at 0. Once per process (setup_telemetry)."""
    global _installed
    if _installed:
        return
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    recorded = instruments().start()
    tracer_provider.add_span_processor(FailedCalls(recorded))
    if enabled("redis"):
        RedisInstrumentor().instrument(tracer_provider=tracer_provider)
    _installed = True


def instrument_engine(engine: AsyncEngine) -> None:
    """Spans and connection metrics for the process's task store engine (its sync core,
    which the asyncio engine drives). A process opens one store; the instrumentation can be
    installed once, so a second engine (a test's) stays uninstrumented."""
    global _engine_instrumented
    if not _installed or _engine_instrumented or not enabled("sqlalchemy"):
        return
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    # Its dependency check stops at SQLAlchemy 2.0; the engine events it listens to are
    # unchanged in 2.1 (the pipeline dashboard's connections panel, which
    # tests/integration/test_dashboards.py checks, shows its metrics).
    SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine, skip_dep_check=True)
    _engine_instrumented = True


def instrument_app(app: FastAPI) -> None:
    """Request spans and `http.server.request.duration` for the API (not its probes)."""
    if not _installed or not enabled("fastapi"):
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, excluded_urls=UNINSTRUMENTED_PATHS)


# ------------------------------------------------------------------ logs

LOG_FORMAT: Final = ("%(asctime)s %(levelname)s %(name)s "
                     "trace_id=%(trace_id)s span_id=%(span_id)s %(message)s")
NO_ID: Final = "-"


class TraceIds(logging.Filter):
    """Puts the current span's trace and span ids on every record (`-` outside a span), so a
    log line can be found from its trace and a trace from its log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        else:
            record.trace_id = record.span_id = NO_ID
        return True


def log_with_trace_ids(level: str) -> None:
    """Root logging at `level` in LOG_FORMAT, unless something configured it already."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    for handler in root.handlers:
        handler.addFilter(TraceIds())
