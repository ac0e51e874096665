"""Export options shared by every program, and the Typer helper that adds them.

    @app.command("run")
    @telemetry_options
    def run(..., telemetry: TelemetryOptions) -> None: ...

adds to the command (each also read from the environment variable in brackets):

    --otlp-metrics-url     [OTLP_METRICS_URL]   OTLP/HTTP metrics endpoint (…/v1/metrics)
    --otlp-tracing-url     [OTLP_TRACING_URL]   OTLP/HTTP traces endpoint (…/v1/traces)
    --otlp-logs-url        [OTLP_LOGS_URL]      OTLP/HTTP logs endpoint (…/v1/logs)
    --otlp-auth-header     [OTLP_AUTH_HEADER]   "Name: value" (or Name=value) sent with each export
    --otlp-report-interval [OTLP_REPORT_INTERVAL] seconds between metric exports (60)
    --prometheus-port      [PROMETHEUS_PORT]    serve /metrics for Prometheus on this port
    --prometheus-host      [PROMETHEUS_HOST]    ... on this address (127.0.0.1)

Psyche spells the first five `--oltp-*` (and `OLTP_*`); both spellings are accepted.
The wrapped function receives one validated `TelemetryOptions` instead of seven values.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
from collections.abc import Callable
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_REPORT_INTERVAL_S = 60.0


class TelemetryOptions(BaseModel):
    """Where a program sends its telemetry; all off by default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = 1
    metrics_url: str | None = None
    tracing_url: str | None = None
    logs_url: str | None = None
    auth_header: str | None = None
    report_interval_s: float = Field(default=DEFAULT_REPORT_INTERVAL_S, gt=0, le=3600)
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    prometheus_host: str = "127.0.0.1"
    # Each export gives up after this long; telemetry must never hold up training.
    export_timeout_s: float = Field(default=5.0, gt=0, le=60)

    @field_validator("metrics_url", "tracing_url", "logs_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s) URL such as "
                             "http://collector:4318/v1/metrics")
        return value.strip()

    @field_validator("auth_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        auth_header_pair(value)  # raises ValueError naming the problem
        return value.strip()

    @field_validator("prometheus_host")
    @classmethod
    def _host(cls, value: str) -> str:
        if value == "localhost":
            return value
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address to listen on") from None
        return value

    @property
    def headers(self) -> dict[str, str]:
        if self.auth_header is None:
            return {}
        name, value = auth_header_pair(self.auth_header)
        return {name: value}

    @property
    def exports_anything(self) -> bool:
        return any((self.metrics_url, self.tracing_url, self.logs_url,
                    self.prometheus_port is not None))


def auth_header_pair(text: str) -> tuple[str, str]:
    """`Authorization: Bearer x` or `Authorization=Bearer x` -> ("Authorization", "Bearer x")."""
    separators = [i for i in (text.find(":"), text.find("=")) if i > 0]
    if not separators:
        raise ValueError(f"auth header {text!r} must look like 'Name: value' or 'Name=value'")
    cut = min(separators)
    name, value = text[:cut].strip(), text[cut + 1:].strip()
    if not name or not all(c.isalnum() or c in "-_" for c in name) or not value:
        raise ValueError(f"auth header {text!r} must look like 'Name: value' or 'Name=value'")
    return name, value


# ------------------------------------------------------------------ Typer helper
_MetricsUrl = Annotated[str | None, typer.Option(
    "--otlp-metrics-url", "--oltp-metrics-url", envvar=["OTLP_METRICS_URL", "OLTP_METRICS_URL"],
    help="OTLP/HTTP metrics endpoint, e.g. http://collector:4318/v1/metrics.",
    rich_help_panel="Telemetry")]
_TracingUrl = Annotated[str | None, typer.Option(
    "--otlp-tracing-url", "--oltp-tracing-url", envvar=["OTLP_TRACING_URL", "OLTP_TRACING_URL"],
    help="OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces.",
    rich_help_panel="Telemetry")]
_LogsUrl = Annotated[str | None, typer.Option(
    "--otlp-logs-url", "--oltp-logs-url", envvar=["OTLP_LOGS_URL", "OLTP_LOGS_URL"],
    help="OTLP/HTTP logs endpoint, e.g. http://collector:4318/v1/logs.",
    rich_help_panel="Telemetry")]
_AuthHeader = Annotated[str | None, typer.Option(
    "--otlp-auth-header", "--oltp-auth-header", envvar=["OTLP_AUTH_HEADER", "OLTP_AUTH_HEADER"],
    help="Header sent with every export: 'Name: value'.", rich_help_panel="Telemetry")]
_ReportInterval = Annotated[float, typer.Option(
    "--otlp-report-interval", "--oltp-report-interval",
    envvar=["OTLP_REPORT_INTERVAL", "OLTP_REPORT_INTERVAL"],
    help="Seconds between metric exports.", rich_help_panel="Telemetry")]
_PrometheusPort = Annotated[int | None, typer.Option(
    "--prometheus-port", envvar="PROMETHEUS_PORT",
    help="Serve Prometheus /metrics on this port.", rich_help_panel="Telemetry")]
_PrometheusHost = Annotated[str, typer.Option(
    "--prometheus-host", envvar="PROMETHEUS_HOST",
    help="Address the Prometheus endpoint listens on.", rich_help_panel="Telemetry")]

_ADDED: list[tuple[str, Any, Any]] = [
    ("otlp_metrics_url", _MetricsUrl, None),
    ("otlp_tracing_url", _TracingUrl, None),
    ("otlp_logs_url", _LogsUrl, None),
    ("otlp_auth_header", _AuthHeader, None),
    ("otlp_report_interval", _ReportInterval, DEFAULT_REPORT_INTERVAL_S),
    ("prometheus_port", _PrometheusPort, None),
    ("prometheus_host", _PrometheusHost, "127.0.0.1"),
]
_OPTION_OF_FIELD = {
    "metrics_url": "--otlp-metrics-url", "tracing_url": "--otlp-tracing-url",
    "logs_url": "--otlp-logs-url", "auth_header": "--otlp-auth-header",
    "report_interval_s": "--otlp-report-interval", "prometheus_port": "--prometheus-port",
    "prometheus_host": "--prometheus-host",
}

F = TypeVar("F", bound=Callable[..., Any])


def options_from_values(values: dict[str, Any]) -> TelemetryOptions:
    """Build the options from the added parameters; a bad value is a typer.BadParameter."""
    try:
        return TelemetryOptions(
            metrics_url=values["otlp_metrics_url"], tracing_url=values["otlp_tracing_url"],
            logs_url=values["otlp_logs_url"], auth_header=values["otlp_auth_header"],
            report_interval_s=values["otlp_report_interval"],
            prometheus_port=values["prometheus_port"],
            prometheus_host=values["prometheus_host"])
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        raise typer.BadParameter(message, param_hint=_OPTION_OF_FIELD.get(field, field)) from None


def telemetry_options(func: F) -> F:
    """Replace the `telemetry: TelemetryOptions` parameter of a Typer command by the options."""
    signature = inspect.signature(func, eval_str=True)
    if "telemetry" not in signature.parameters:
        raise TypeError(f"{func.__name__} needs a `telemetry: TelemetryOptions` parameter")
    kept = [p for p in signature.parameters.values() if p.name != "telemetry"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                               annotation=annotation) for name, annotation, default in _ADDED]
    positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept
               if p.kind is inspect.Parameter.KEYWORD_ONLY]
    new_signature = signature.replace(parameters=[*positional, *keyword, *added])

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name, _, _ in _ADDED if name in kwargs}
        defaults = {name: default for name, _, default in _ADDED}
        kwargs["telemetry"] = options_from_values({**defaults, **values})
        return func(*args, **kwargs)

    wrapper.__signature__ = new_signature  # type: ignore[attr-defined]  # read by inspect.signature; not in typeshed
    wrapper.__annotations__ = {p.name: p.annotation for p in new_signature.parameters.values()}
    wrapper.__annotations__["return"] = signature.return_annotation
    del wrapper.__wrapped__  # Typer must see the new signature
    return wrapper  # type: ignore[return-value]  # functools.wraps' type is not F
