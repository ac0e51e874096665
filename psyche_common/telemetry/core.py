"""`Telemetry`: one program's OpenTelemetry providers, exporters and instruments.

    telemetry = Telemetry.start(options, ServiceIdentity("client", node_id_hex, run_id))
    telemetry.counter("psyche_witnesses_sent_total").add(1, {"type": "witness"})
    telemetry.observe("psyche_round_step", lambda: [(step, {})])
    with telemetry.span("train", step=3): ...
    telemetry.shutdown()

Resource (docs/metrics.md, "Resource attributes"): service.name, service.instance.id
(node id hex, or "server"), service.namespace "psyche", deployment.environment.name
($DEPLOYMENT_ENV, default "development"), run.id, service.version. Instruments are
created once, from the registry in names.py, so what is exported is exactly what the
dashboards are checked against. Metrics go to the OTLP/HTTP endpoint every report
interval (a background thread) and to the Prometheus endpoint on each scrape; traces and
logs are batched in background threads. An export that fails is dropped with one warning
per failure streak: nothing here ever blocks or fails training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, Tracer

from psyche_common.telemetry.dropping import (
    DroppingLogExporter,
    DroppingMetricExporter,
    DroppingSpanExporter,
)
from psyche_common.telemetry.names import (
    METER_NAMES,
    METRICS_BY_SERVICE,
    SERVICE_NAMES,
    MetricSpec,
    Service,
)
from psyche_common.telemetry.options import TelemetryOptions
from psyche_common.telemetry.prometheus import PrometheusEndpoint

log = logging.getLogger(__name__)
Observed = Callable[[], Iterable[tuple[float, dict[str, str]]]]


@dataclass(frozen=True)
class ServiceIdentity:
    service: Service
    instance_id: str  # node identity hex, or "server"
    run_id: str = ""
    version: str = ""

    def resource(self) -> Resource:
        from psyche_common.telemetry import __version__

        return Resource.create({
            "service.name": SERVICE_NAMES[self.service],
            "service.instance.id": self.instance_id,
            "service.namespace": "psyche",
            "deployment.environment.name": os.environ.get("DEPLOYMENT_ENV") or "development",
            "run.id": self.run_id,
            "service.version": self.version or __version__,
        })


_SEVERITY = {logging.DEBUG: SeverityNumber.DEBUG, logging.INFO: SeverityNumber.INFO,
             logging.WARNING: SeverityNumber.WARN, logging.ERROR: SeverityNumber.ERROR,
             logging.CRITICAL: SeverityNumber.FATAL}


class OtlpLogHandler(logging.Handler):
    """Python logging -> OTLP log records (the SDK's LoggingHandler is deprecated)."""

    def __init__(self, provider: LoggerProvider, scope: str, level: int = logging.INFO):
        super().__init__(level)
        self.logger = provider.get_logger(scope)

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("opentelemetry", "psyche_common.telemetry")):
            return  # never export our own export warnings (a loop when the link is down)
        try:
            self.logger.emit(
                timestamp=int(record.created * 1e9), body=record.getMessage(),
                severity_number=_SEVERITY.get(record.levelno, SeverityNumber.INFO),
                severity_text=record.levelname,
                attributes={"code.namespace": record.name, "code.lineno": record.lineno})
        except Exception:
            self.handleError(record)


class Telemetry:
    def __init__(self, options: TelemetryOptions, identity: ServiceIdentity):
        self.options = options
        self.identity = identity
        self.resource = identity.resource()
        self.specs: dict[str, MetricSpec] = {s.name: s for s in METRICS_BY_SERVICE[identity.service]}
        self.prometheus: PrometheusEndpoint | None = None
        self._observed: dict[str, Observed] = {}
        self._log_handler: OtlpLogHandler | None = None

        readers: list[MetricReader] = []
        timeout_s = min(options.export_timeout_s, options.report_interval_s)
        if options.metrics_url:
            exporter = DroppingMetricExporter(options.metrics_url, options.headers, timeout_s)
            readers.append(PeriodicExportingMetricReader(
                exporter, export_interval_millis=options.report_interval_s * 1000,
                export_timeout_millis=timeout_s * 1000))
        if options.prometheus_port is not None:
            self.prometheus = PrometheusEndpoint(options.prometheus_host, options.prometheus_port)
            readers.append(self.prometheus.reader)
        self.meter_provider = MeterProvider(resource=self.resource, metric_readers=readers)
        self.meter = self.meter_provider.get_meter(METER_NAMES[identity.service])
        self.instruments: dict[str, Any] = {s.name: self._create(s) for s in self.specs.values()}

        self.tracer_provider = TracerProvider(resource=self.resource)
        if options.tracing_url:
            self.tracer_provider.add_span_processor(BatchSpanProcessor(
                DroppingSpanExporter(options.tracing_url, options.headers, timeout_s),
                export_timeout_millis=int(timeout_s * 1000)))
        self.tracer: Tracer = self.tracer_provider.get_tracer(METER_NAMES[identity.service])

        self.logger_provider: LoggerProvider | None = None
        if options.logs_url:
            self.logger_provider = LoggerProvider(resource=self.resource)
            self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(
                DroppingLogExporter(options.logs_url, options.headers, timeout_s),
                export_timeout_millis=int(timeout_s * 1000)))
            self._log_handler = OtlpLogHandler(self.logger_provider, METER_NAMES[identity.service])
            logging.getLogger().addHandler(self._log_handler)

    @classmethod
    def start(cls, options: TelemetryOptions, identity: ServiceIdentity) -> Telemetry:
        """Build the providers and start the Prometheus endpoint (OSError if its port is taken)."""
        telemetry = cls(options, identity)
        if telemetry.prometheus is not None:
            try:
                telemetry.prometheus.start()
            except OSError:
                telemetry.shutdown()
                raise
        return telemetry

    # ------------------------------------------------------------------ instruments
    def _create(self, spec: MetricSpec) -> Any:
        name, unit, description = spec.name, spec.otel_unit, spec.description
        if spec.kind == "counter":
            return self.meter.create_counter(name, unit, description)
        if spec.kind == "gauge":
            return self.meter.create_gauge(name, unit, description)
        if spec.kind == "histogram":
            return self.meter.create_histogram(name, unit, description)
        callbacks = [self._callback_for(spec.name)]
        if spec.kind == "observable_gauge":
            return self.meter.create_observable_gauge(name, callbacks, unit, description)
        return self.meter.create_observable_counter(name, callbacks, unit, description)

    def _callback_for(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            source = self._observed.get(name)
            if source is None:
                return []
            try:  # runs on an exporter or scrape thread: a bug here must not kill it
                return [Observation(value, attributes) for value, attributes in source()
                        if value is not None and math.isfinite(value)]
            except Exception:
                log.warning("telemetry: reading %s failed", name, exc_info=True)
                return []
        return callback

    def _instrument(self, name: str, kinds: Sequence[str]) -> Any:
        spec = self.specs.get(name)
        if spec is None:
            raise KeyError(f"{name} is not a {self.identity.service} metric (see names.py)")
        if spec.kind not in kinds:
            raise TypeError(f"{name} is a {spec.kind}, not a {' or '.join(kinds)}")
        return self.instruments[name]

    def counter(self, name: str) -> Any:
        return self._instrument(name, ("counter",))

    def gauge(self, name: str) -> Any:
        return self._instrument(name, ("gauge",))

    def observe(self, name: str, source: Observed) -> None:
        """`source()` returns (value, labels) pairs each time the metric is collected."""
        self._instrument(name, ("observable_gauge", "observable_counter"))
        self._observed[name] = source

    # ------------------------------------------------------------------ logs
    def log_event(self, event: str, fields: dict[str, Any]) -> None:
        """One structured log record per runtime event (Loki: event name + fields)."""
        if self.logger_provider is None:
            return
        attributes = {f"psyche.{k}": v if isinstance(v, bool | int | float | str) else str(v)
                      for k, v in fields.items()}
        details = " ".join(f"{k}={v}" for k, v in fields.items())
        self.logger_provider.get_logger(METER_NAMES[self.identity.service]).emit(
            severity_number=SeverityNumber.INFO, severity_text="INFO", event_name=event,
            body=f"{event} {details}".strip(), attributes={"psyche.event": event, **attributes})

    # ------------------------------------------------------------------ traces
    @contextlib.contextmanager
    def span(self, name: str, **attributes: Any) -> Iterator[Span]:
        with self.tracer.start_as_current_span(
                name, attributes={f"psyche.{k}": v for k, v in attributes.items()}) as span:
            yield span

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout_s: float = 5.0) -> None:
        millis = int(timeout_s * 1000)
        with contextlib.suppress(Exception):
            self.meter_provider.force_flush(millis)
        with contextlib.suppress(Exception):
            self.tracer_provider.force_flush(millis)
        if self.logger_provider is not None:
            with contextlib.suppress(Exception):
                self.logger_provider.force_flush(millis)

    def shutdown(self) -> None:
        """Flush what can be flushed (bounded by the export timeout), then stop everything."""
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler = None
        for provider in (self.tracer_provider, self.logger_provider, self.meter_provider):
            if provider is not None:
                with contextlib.suppress(Exception):
                    provider.shutdown()
        if self.prometheus is not None:
            self.prometheus.stop()
