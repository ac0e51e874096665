"""Reads the client's local metrics endpoint: HTTP GET http://127.0.0.1:PORT/ -> ClientMetrics."""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from psyche_common.metrics_schema import ClientMetrics


class MetricsUnavailable(Exception):
    """The endpoint did not answer with valid metrics; the message says what went wrong."""


class HttpClientMetricsSource:
    """Polls one client's metrics endpoint (the container runs on the host network)."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 2.0) -> None:
        self.url = f"http://{host}:{port}/"
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def fetch(self) -> ClientMetrics:
        try:
            response = await self._http.get(self.url)
        except httpx.HTTPError as error:
            raise MetricsUnavailable(f"client metrics at {self.url}: {error or type(error).__name__}") from None
        if response.status_code != 200:
            raise MetricsUnavailable(f"client metrics at {self.url}: HTTP {response.status_code}")
        try:
            return ClientMetrics.model_validate_json(response.content)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise MetricsUnavailable(
                f"client metrics at {self.url}: invalid ({error.error_count()} errors; "
                f"first: {where}: {first['msg']})"
            ) from None

    async def close(self) -> None:
        await self._http.aclose()
