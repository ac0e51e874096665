"""The Prometheus endpoint: a private registry served over HTTP on (host, port).

Each program gets its own registry (not prometheus_client's global one), so several
telemetry instances in one process (tests) never mix their series. The resource
attributes service.name, service.instance.id and run.id are copied onto every series
as `service_name`, `service_instance_id`, `run_id`, the labels the dashboards filter on
(the collector config gets the same labels with resource_to_telemetry_conversion).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry, start_http_server

LABELLED_RESOURCE_ATTRIBUTES = frozenset({"service.name", "service.instance.id", "run.id"})


class PrometheusEndpoint:
    def __init__(self, host: str, port: int):
        self.host, self.requested_port = host, port
        self.registry = CollectorRegistry(auto_describe=True)
        self.reader = PrometheusMetricReader(
            registry=self.registry, scope_info_enabled=False,
            resource_attribute_filter=lambda key: key in LABELLED_RESOURCE_ATTRIBUTES)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._server is None:
            return self.requested_port
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._server, self._thread = start_http_server(
            self.requested_port, addr=self.host, registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
