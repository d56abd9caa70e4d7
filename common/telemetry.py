"""OpenTelemetry for every service: traces and metrics, exported over OTLP when configured.

Trace context crosses Kafka in W3C `traceparent` headers (FastStream's telemetry middleware
writes and reads them), so one trace follows a fault from the agent's report to the task's
last step. Without `OTEL_EXPORTER_OTLP_ENDPOINT` spans are still made and propagated, only
not exported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from common import observability


@dataclass(frozen=True)
class Telemetry:
    """The providers of one process."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def tracer(self, name: str) -> trace.Tracer:
        return self.tracer_provider.get_tracer(name)

    def meter(self, name: str) -> metrics.Meter:
        return self.meter_provider.get_meter(name)


_process_telemetry: Telemetry | None = None


def setup_telemetry(service_name: str) -> Telemetry:
    """Providers for this process (made once; later calls return the same ones)."""
    global _process_telemetry
    if _process_telemetry is not None:
        return _process_telemetry
    resource = Resource.create(
        {"service.name": os.getenv("OTEL_SERVICE_NAME", service_name),
         "service.namespace": "clusterwarden"}
    )
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = []
    if os.getenv("OTEL_EXPORTER_OTLP_ENDPOINT"):
        # Imported here so a process without an endpoint never loads grpc.
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    # Also pulled by Prometheus on WARDEN_METRICS_PORT, when it is set (common/observability.py).
    prometheus = observability.prometheus_reader()
    if prometheus is not None:
        readers.append(prometheus)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    observability.install(tracer_provider)
    _process_telemetry = Telemetry(tracer_provider, meter_provider)
    return _process_telemetry


def shutdown_telemetry() -> None:
    """Flush what is buffered (called on service shutdown)."""
    if _process_telemetry is not None:
        _process_telemetry.tracer_provider.shutdown()
        _process_telemetry.meter_provider.shutdown()
