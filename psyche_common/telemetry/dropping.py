"""OTLP/HTTP exporters that drop what they cannot deliver, with one warning per streak.

The SDK's exporters already run on background threads (periodic metric reader, batch
span and log processors); these wrappers add the rest of "never blocks training": a
short per-request timeout, no exception escaping an export, and one warning when a
destination starts failing (plus one when it recovers) instead of a traceback per batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("psyche_common.telemetry")
# The SDK's own exporter loggers would print a line (or a traceback) per failed batch.
for _noisy in ("opentelemetry.exporter.otlp.proto.http",
               "opentelemetry.exporter.otlp.proto.http.metric_exporter",
               "opentelemetry.exporter.otlp.proto.http.trace_exporter",
               "opentelemetry.exporter.otlp.proto.http._log_exporter",
               "opentelemetry.exporter.http_transport",
               "opentelemetry.sdk.metrics._internal.export"):
    logging.getLogger(_noisy).setLevel(logging.CRITICAL)


class FailureStreak:
    """Counts dropped batches; warns when a destination starts and stops failing."""

    def __init__(self, what: str, url: str):
        self.what, self.url = what, url
        self.dropped_batches = 0
        self.failing = False
        self._lock = threading.Lock()

    def record(self, ok: bool, reason: str = "") -> None:
        with self._lock:
            if ok:
                if self.failing:
                    log.warning("telemetry: %s export to %s works again", self.what, self.url)
                self.failing = False
                return
            self.dropped_batches += 1
            if not self.failing:
                log.warning("telemetry: cannot export %s to %s (%s); dropping them until "
                            "it answers", self.what, self.url, reason or "export failed")
            self.failing = True


class DroppingMetricExporter(MetricExporter):
    def __init__(self, url: str, headers: dict[str, str], timeout_s: float):
        self.inner = OTLPMetricExporter(endpoint=url, headers=headers, timeout=timeout_s)
        super().__init__(preferred_temporality=self.inner._preferred_temporality,
                         preferred_aggregation=self.inner._preferred_aggregation)
        self.streak = FailureStreak("metrics", url)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
        except Exception as exc:
            self.streak.record(False, repr(exc))
            return MetricExportResult.FAILURE
        self.streak.record(result is MetricExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        try:
            self.inner.shutdown()
        except Exception:
            log.debug("metric exporter shutdown", exc_info=True)


class DroppingSpanExporter(SpanExporter):
    def __init__(self, url: str, headers: dict[str, str], timeout_s: float):
        self.inner = OTLPSpanExporter(endpoint=url, headers=headers, timeout=timeout_s)
        self.streak = FailureStreak("traces", url)

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            self.streak.record(False, repr(exc))
            return SpanExportResult.FAILURE
        self.streak.record(result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        except Exception:
            log.debug("span exporter shutdown", exc_info=True)


class DroppingLogExporter(LogRecordExporter):
    def __init__(self, url: str, headers: dict[str, str], timeout_s: float):
        self.inner = OTLPLogExporter(endpoint=url, headers=headers, timeout=timeout_s)
        self.streak = FailureStreak("logs", url)

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        try:
            result = self.inner.export(batch)
        except Exception as exc:
            self.streak.record(False, repr(exc))
            return LogRecordExportResult.FAILURE
        self.streak.record(result is LogRecordExportResult.SUCCESS)
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        try:
            self.inner.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
        except Exception:
            log.debug("log exporter shutdown", exc_info=True)
