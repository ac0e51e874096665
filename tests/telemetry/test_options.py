"""The export options every program takes: spellings, environment, clear errors."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from client_image.cli import app as client_app
from coordinator_tcp.cli import app as coordinator_app
from psyche_common.telemetry import TelemetryOptions, telemetry_options
from psyche_common.telemetry.options import auth_header_pair
from run_manager.cli import app as run_manager_app

runner = CliRunner()
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def probe_app() -> tuple[typer.Typer, list[TelemetryOptions]]:
    seen: list[TelemetryOptions] = []
    app = typer.Typer()

    @app.command()
    @telemetry_options
    def go(name: str = "x", *, telemetry: TelemetryOptions) -> None:
        assert name == "x"
        seen.append(telemetry)

    return app, seen


def test_defaults_export_nothing() -> None:
    app, seen = probe_app()
    result = runner.invoke(app, [], env={})
    assert result.exit_code == 0, result.output
    assert seen == [TelemetryOptions()] and not seen[0].exports_anything
    assert seen[0].report_interval_s == 60 and seen[0].prometheus_host == "127.0.0.1"


def test_both_spellings_and_both_environment_variables() -> None:
    app, seen = probe_app()
    result = runner.invoke(app, [
        "--oltp-metrics-url", "http://collector:4318/v1/metrics",
        "--otlp-tracing-url", "https://collector:4318/v1/traces",
        "--oltp-auth-header", "Authorization: Bearer abc",
        "--oltp-report-interval", "5", "--prometheus-port", "9464",
        "--prometheus-host", "0.0.0.0"],
        env={"OTLP_LOGS_URL": "http://collector:4318/v1/logs"})
    assert result.exit_code == 0, result.output
    (options,) = seen
    assert options.metrics_url == "http://collector:4318/v1/metrics"
    assert options.tracing_url == "https://collector:4318/v1/traces"
    assert options.logs_url == "http://collector:4318/v1/logs"
    assert options.headers == {"Authorization": "Bearer abc"}
    assert options.report_interval_s == 5 and options.prometheus_port == 9464
    assert options.prometheus_host == "0.0.0.0" and options.exports_anything
    seen.clear()
    result = runner.invoke(app, [], env={"OLTP_METRICS_URL": "http://c:4318/v1/metrics",
                                         "OLTP_REPORT_INTERVAL": "2.5"})
    assert result.exit_code == 0, result.output
    assert seen[0].metrics_url == "http://c:4318/v1/metrics" and seen[0].report_interval_s == 2.5


@pytest.mark.parametrize(("args", "option", "reason"), [
    (["--otlp-metrics-url", "ftp://collector/v1/metrics"], "--otlp-metrics-url", "http(s) URL"),
    (["--oltp-tracing-url", "collector:4318"], "--otlp-tracing-url", "http(s) URL"),
    (["--otlp-auth-header", "just-a-token"], "--otlp-auth-header", "Name: value"),
    (["--otlp-report-interval", "0"], "--otlp-report-interval", "greater than 0"),
    (["--prometheus-host", "my host"], "--prometheus-host", "not an IP address"),
    (["--prometheus-port", "70000"], "--prometheus-port", "less than or equal to 65535"),
])
def test_bad_values_are_refused_naming_the_option(args: list[str], option: str,
                                                  reason: str) -> None:
    app, seen = probe_app()
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    output = " ".join(ANSI.sub("", result.output).replace("│", " ").split())
    assert result.exit_code == 2 and not seen
    assert option in output and reason in output, output


def test_auth_header_forms() -> None:
    assert auth_header_pair("Authorization=Basic a2V5") == ("Authorization", "Basic a2V5")
    assert auth_header_pair("X-Api-Key: k=v") == ("X-Api-Key", "k=v")
    for bad in ("=value", "Name:", "bad name: v"):
        with pytest.raises(ValueError, match="Name: value"):
            auth_header_pair(bad)


@pytest.mark.parametrize(("app", "args"), [
    (client_app, ["train", "--help"]),
    (coordinator_app, ["run", "--help"]),
    (run_manager_app, ["--help"]),
], ids=["psyche-client train", "psyche-coordinator run", "run-manager"])
def test_every_program_has_the_options(app: typer.Typer, args: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = ANSI.sub("", result.output)
    for option in ("--otlp-metrics-url", "--oltp-metrics-url", "--otlp-tracing-url",
                   "--otlp-logs-url", "--otlp-auth-header", "--otlp-report-interval",
                   "--prometheus-port", "--prometheus-host"):
        assert option in text, f"{option} missing from {' '.join(args)}"


def test_a_program_refuses_a_bad_url_before_doing_anything(tmp_path: object) -> None:
    result = runner.invoke(coordinator_app, ["run", "--state", "/nonexistent/state.toml",
                                             "--otlp-logs-url", "loki:3100"], env={})
    assert result.exit_code == 2
    assert "--otlp-logs-url" in ANSI.sub("", result.output)
