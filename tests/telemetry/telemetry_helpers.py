"""Real receivers for the telemetry tests: an OTLP/HTTP receiver and a Prometheus server.

OtlpReceiver: a threaded HTTP server on 127.0.0.1 that stores every POST to
/v1/metrics, /v1/traces and /v1/logs and answers like a collector (200 + an empty
protobuf response); the payloads are decoded with opentelemetry.proto's classes.

PrometheusServer: Debian's `prometheus` binary started directly (never the system
service) with a temp config scraping the given targets every second, a temp storage
dir and a free loopback port; queried through its HTTP API.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from loopback import free_port
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from processes import stop_process


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def attributes(pairs: Iterator[KeyValue] | Any) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


_RESPONSES = {"/v1/metrics": ExportMetricsServiceResponse, "/v1/traces": ExportTraceServiceResponse,
              "/v1/logs": ExportLogsServiceResponse}


class OtlpReceiver:
    def __init__(self, port: int = 0) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(min(length, 64 << 20))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                response_type = _RESPONSES.get(self.path)
                if response_type is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.received.append(Received(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                payload = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, signal: str) -> str:
        return f"http://127.0.0.1:{self.port}/v1/{signal}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _bodies(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    def metrics(self) -> list[ExportMetricsServiceRequest]:
        return [ExportMetricsServiceRequest.FromString(r.body) for r in self._bodies("/v1/metrics")]

    def traces(self) -> list[ExportTraceServiceRequest]:
        return [ExportTraceServiceRequest.FromString(r.body) for r in self._bodies("/v1/traces")]

    def logs(self) -> list[ExportLogsServiceRequest]:
        return [ExportLogsServiceRequest.FromString(r.body) for r in self._bodies("/v1/logs")]

    def headers(self, path: str) -> list[dict[str, str]]:
        return [r.headers for r in self._bodies(path)]


def metric_names_by_service(requests: list[ExportMetricsServiceRequest]
                            ) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for request in requests:
        for resource_metrics in request.resource_metrics:
            service = attributes(resource_metrics.resource.attributes)["service.name"]
            for scope in resource_metrics.scope_metrics:
                names.setdefault(service, set()).update(m.name for m in scope.metrics)
    return names


class PrometheusServer:
    def __init__(self, workdir: Path, targets: dict[str, list[str]]):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("the prometheus binary is missing: apt-get install -y prometheus")
        self.binary = binary
        self.port = free_port()
        self.workdir = workdir
        jobs = [{"job_name": job, "scrape_interval": "1s", "scrape_timeout": "900ms",
                 "static_configs": [{"targets": addresses}]} for job, addresses in targets.items()]
        # JSON is YAML: no YAML writer needed.
        (workdir / "prometheus.yml").write_text(json.dumps(
            {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
             "scrape_configs": jobs}))
        self.process: subprocess.Popen[bytes] | None = None
        self.base = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with (self.workdir / "prometheus.log").open("wb") as log:  # the child keeps its copy
            self.process = subprocess.Popen(
                [self.binary, f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("prometheus exited: "
                                   + (self.workdir / "prometheus.log").read_text()[-2000:])
            try:
                if httpx.get(f"{self.base}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus did not become ready in 30 s")

    def stop(self) -> None:
        stop_process(self.process)

    def query(self, expr: str) -> dict[str, Any]:
        """The `data` of an instant query; raises with Prometheus' error text."""
        reply = httpx.get(f"{self.base}/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body.get('error')}")
        return dict(body["data"])

    def samples(self, selector: str, window: str = "15m") -> list[tuple[dict[str, str], list[float]]]:
        """Raw samples of every series matching `selector` over the window."""
        data = self.query(f"{selector}[{window}]")
        return [(series["metric"], [float(v) for _, v in series["values"]])
                for series in data["result"]]

    def scraped_targets(self) -> list[dict[str, Any]]:
        reply = httpx.get(f"{self.base}/api/v1/targets", timeout=10).json()
        return list(reply["data"]["activeTargets"])
