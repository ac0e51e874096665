"""The one-command telemetry stack (telemetry/docker-compose.yml) fits together, checked
from its files (no image is pulled or run here): every service's config exists where it
is mounted, the collector routes metrics to the Prometheus exporter that Prometheus
scrapes and logs to the Loki service, Grafana's datasources and dashboard provider point
at the services and at the mounted dashboards, and those dashboards parse and query
only metrics the programs export."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from psyche_common.telemetry.names import prometheus_names

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "telemetry"
COMPOSE = STACK / "docker-compose.yml"
METRIC = re.compile(r"\bpsyche_[a-z0-9_]+\b")


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return dict(load(COMPOSE)["services"])


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of each bind mount (named volumes left out)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            found[target] = (STACK / source).resolve()
    return found


def host_path(service: dict[str, Any], container_path: str) -> Path:
    """Where a path inside the container comes from on the host, through its mounts."""
    path = PurePosixPath(container_path)
    for target, source in mounts(service).items():
        if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
            return source / path.relative_to(target)
    raise AssertionError(f"{container_path} is not mounted from the repository")


def config_flag(service: dict[str, Any], prefix: str) -> str:
    command = service["command"]
    [value] = [arg.split("=", 1)[1] for arg in command if arg.startswith(prefix)]
    return str(value)


def test_the_four_services_with_pinned_images(services: dict[str, Any]) -> None:
    assert set(services) == {"otel-collector", "prometheus", "loki", "grafana"}
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)


def test_every_mounted_config_exists(services: dict[str, Any]) -> None:
    for name, service in services.items():
        bound = mounts(service)
        assert bound, f"{name} mounts no config"
        for target, source in bound.items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is missing"
    assert host_path(services["otel-collector"], config_flag(
        services["otel-collector"], "--config=")).is_file()
    assert host_path(services["prometheus"], config_flag(
        services["prometheus"], "--config.file=")).is_file()
    assert host_path(services["loki"], config_flag(services["loki"], "-config.file=")).is_file()


def test_the_collector_routes_metrics_to_prometheus_and_logs_to_loki(
        services: dict[str, Any]) -> None:
    collector = services["otel-collector"]
    config = load(host_path(collector, config_flag(collector, "--config=")))
    pipelines = config["service"]["pipelines"]
    assert "otlp" in pipelines["metrics"]["receivers"] and "otlp" in pipelines["logs"]["receivers"]
    assert "4318:4318" in collector["ports"]  # the programs push OTLP/HTTP here

    [metrics_out] = pipelines["metrics"]["exporters"]
    assert metrics_out.split("/")[0] == "prometheus"
    exporter_port = config["exporters"][metrics_out]["endpoint"].rsplit(":", 1)[1]
    prometheus = services["prometheus"]
    scrape = load(host_path(prometheus, config_flag(prometheus, "--config.file=")))
    targets = {target for job in scrape["scrape_configs"]
               for static in job.get("static_configs", []) for target in static["targets"]}
    assert f"otel-collector:{exporter_port}" in targets  # the compose service, that port

    [logs_out] = pipelines["logs"]["exporters"]
    loki_url = urlparse(config["exporters"][logs_out]["endpoint"])
    loki = services["loki"]
    loki_config = load(host_path(loki, config_flag(loki, "-config.file=")))
    assert (loki_url.hostname, loki_url.port, loki_url.path) == (
        "loki", loki_config["server"]["http_listen_port"], "/otlp")
    assert loki_config["limits_config"]["allow_structured_metadata"] is True  # OTLP needs it


def test_grafana_points_at_the_services_and_the_mounted_dashboards(
        services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    provisioning = grafana["environment"]["GF_PATHS_PROVISIONING"]
    sources = load(host_path(grafana, f"{provisioning}/datasources/psyche.yaml"))["datasources"]
    urls = {source["type"]: urlparse(source["url"]) for source in sources}
    assert (urls["prometheus"].hostname, urls["prometheus"].port) == ("prometheus", 9090)
    assert "9090:9090" in services["prometheus"]["ports"]
    assert (urls["loki"].hostname, urls["loki"].port) == ("loki", 3100)

    [provider] = load(host_path(grafana, f"{provisioning}/dashboards/psyche.yaml"))["providers"]
    dashboards = sorted(host_path(grafana, provider["options"]["path"]).glob("*.json"))
    assert len(dashboards) >= 4, dashboards
    exported = prometheus_names()
    referenced = set()
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        assert dashboard["title"].startswith("Psyche / ") and dashboard["panels"]
        names = set(METRIC.findall(path.read_text()))
        assert names, f"{path.name} queries no psyche_ metric"
        assert names <= exported, (path.name, sorted(names - exported))
        referenced |= names
    # the two of Psyche's StatsLogger are on a dashboard too
    assert {"psyche_training_confidence", "psyche_training_efficiency"} <= referenced


def test_the_readme_tells_the_one_command() -> None:
    readme = (STACK / "README.md").read_text()
    assert "docker compose up -d" in readme and "http://localhost:3000" in readme
