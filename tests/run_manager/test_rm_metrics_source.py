"""The client-metrics source against a real HTTP server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from psyche_common.metrics_schema import ClientMetrics
from psyche_common.metrics_source import HttpClientMetricsSource, MetricsUnavailable

PSYCHE_PAYLOAD = {
    "connected_peers": [
        {"endpoint_id": "ab12", "selected_path": {"addr": "127.0.0.1:4433", "rtt": {"secs": 0, "nanos": 2_500_000}}},
        {"endpoint_id": "cd34", "selected_path": None},
    ],
    "bandwidth": 1234.5, "round_step": 7, "role": "Witness", "broadcasts_seen": 3,
    "apply_message_success": 2, "apply_message_failure": 0, "apply_message_ignored": 1,
    "finishes_received_current_round": 2, "finishes_received_previous_round": 3,
    "result_announcements_received_current_round": 2,
    "result_announcements_received_previous_round": 3,
    "results_downloaded_current_round": 2, "results_downloaded_previous_round": 3,
    "witnesses_sent": 1, "gossip_neighbors": ["ab12"], "downloads_started": 5,
    "downloads_finished": 4, "downloads_retry": 1, "downloads_failed": 0,
    "downloads_perma_failed": 0, "downloads_bytes": 99_000,
    "phase": "RoundTrain", "epoch": 1, "step": 7, "loss": 3.25, "tokens_per_sec": 812.0,
    "last_result_sizes": [40960, 40960],
}  # fmt: skip


@contextmanager
def serving(body: bytes, status: int = 200) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_fetches_and_validates_the_clients_metrics() -> None:
    body = ClientMetrics.model_validate(PSYCHE_PAYLOAD).model_dump_json().encode()
    with serving(body) as port:
        source = HttpClientMetricsSource(port)
        try:
            metrics = await source.fetch()
        finally:
            await source.close()
    assert metrics.role == "Witness" and metrics.step == 7 and metrics.loss == 3.25
    assert metrics.connected_peers[0].selected_path is not None
    assert metrics.connected_peers[0].selected_path.rtt.seconds == pytest.approx(0.0025)
    assert metrics.last_result_sizes == [40960, 40960]


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        (b"{not json", 200, "invalid"),
        (b'{"role": "Boss"}', 200, "role"),
        (b'{"downloads_bytes": -1}', 200, "downloads_bytes"),
        (b'{"surprise": 1}', 200, "surprise"),
        (b"{}", 500, "HTTP 500"),
    ],
)
async def test_bad_answers_become_clear_errors(body: bytes, status: int, expected: str) -> None:
    with serving(body, status) as port:
        source = HttpClientMetricsSource(port)
        try:
            with pytest.raises(MetricsUnavailable, match=expected):
                await source.fetch()
        finally:
            await source.close()


async def test_no_client_listening_is_reported() -> None:
    source = HttpClientMetricsSource(9, timeout_s=1)
    try:
        with pytest.raises(MetricsUnavailable, match=r"127\.0\.0\.1:9"):
            await source.fetch()
    finally:
        await source.close()


def test_the_metrics_module_stays_light() -> None:
    import subprocess
    import sys

    probe = (
        "import sys\nfrom psyche_common.metrics_schema import ClientMetrics\n"
        "print(sorted(m for m in ('httpx', 'docker', 'textual', 'pydantic_settings', 'torch') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
