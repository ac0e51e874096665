"""Every file of dashboards/ parses and every query names a metric we really export.

"Really export" is checked twice: against the registry the instruments are created
from (names.py), and against a real scrape of every program's instruments (each one
recorded once), so a registry entry the exporter would rename cannot slip through.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from psyche_common.telemetry.names import METRICS_BY_SERVICE, RESOURCE_LABELS, prometheus_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
DASHBOARD_FILES = sorted((DASHBOARDS / "grafana" / "dashboards").glob("*.json"))
METRIC = re.compile(r"\b(psyche_[a-z0-9_]+|target_info)\b")
LABEL_MATCHER = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"")


def scraped_series() -> dict[str, set[str]]:
    """Series name -> label names, from a real scrape of every program's instruments."""
    series: dict[str, set[str]] = {}
    for service, specs in METRICS_BY_SERVICE.items():
        telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                    ServiceIdentity(service, "id", "run"))
        try:
            for spec in specs:
                labels = dict.fromkeys(spec.labels, "x")
                if spec.kind == "counter":
                    telemetry.counter(spec.name).add(1, labels)
                elif spec.kind == "gauge":
                    telemetry.gauge(spec.name).set(1, labels)
                elif spec.kind.startswith("observable"):
                    telemetry.observe(spec.name, lambda labels=labels: [(1.0, labels)])
                else:
                    telemetry.instruments[spec.name].record(1, labels)
            assert telemetry.prometheus is not None
            text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics",
                             timeout=5).text
        finally:
            telemetry.shutdown()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    return scraped_series()


def test_the_registry_predicts_the_scraped_names(exported: dict[str, set[str]]) -> None:
    psyche = {name for name in exported if name.startswith("psyche_")}
    assert psyche == prometheus_names()
    for name, labels in exported.items():
        if name.startswith("psyche_"):
            assert set(RESOURCE_LABELS) <= labels, (name, labels)


def prometheus_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    panels = [(panel["title"], target["expr"])
              for panel in dashboard["panels"] for target in panel.get("targets", [])
              if target.get("datasource", {}).get("type") == "prometheus"]
    variables = [(f"${variable['name']}", variable["query"]["query"])
                 for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    return panels + variables


def test_there_are_the_four_dashboards() -> None:
    titles = {json.loads(p.read_text())["title"] for p in DASHBOARD_FILES}
    assert titles == {"Psyche / Run overview", "Psyche / Clients",
                      "Psyche / P2P and model sharing", "Psyche / Run manager"}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_dashboard_is_classic_json_with_a_sane_layout(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["schemaVersion"] == 41 and dashboard["uid"].startswith("psyche-")
    assert dashboard["refresh"] == "30s" and dashboard["time"]["from"].startswith("now-")
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], f"{panel['title']} has no query"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_query_names_exported_metrics_and_labels(
        path: Path, exported: dict[str, set[str]]) -> None:
    dashboard = json.loads(path.read_text())
    targets = prometheus_targets(dashboard)
    assert targets
    for title, expr in targets:
        names = METRIC.findall(expr)
        assert names, f"{path.name} / {title}: no psyche metric in {expr!r}"
        for name in names:
            assert name in exported, f"{path.name} / {title}: {name} is not exported"
            labels = exported[name] | {"job", "instance"}
            for label in LABEL_MATCHER.findall(expr):
                assert label in labels, f"{path.name} / {title}: {name} has no label {label}"


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARD_FILES]
    assert len(uids) == len(set(uids))


def test_committed_dashboards_match_the_generator() -> None:
    result = subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), "--check"],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_provisioning_files_point_at_the_dashboards_and_datasources() -> None:
    providers = yaml.safe_load(
        (DASHBOARDS / "grafana/provisioning/dashboards/psyche.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    sources = yaml.safe_load(
        (DASHBOARDS / "grafana/provisioning/datasources/psyche.yaml").read_text())
    uids = {source["uid"]: source["type"] for source in sources["datasources"]}
    assert uids == {"prometheus": "prometheus", "loki": "loki"}
    for path in DASHBOARD_FILES:
        for panel in json.loads(path.read_text())["panels"]:
            source = panel.get("datasource")
            if source and source["type"] == "loki":
                assert source["uid"] in uids


def test_collector_pipelines_use_declared_components() -> None:
    config = yaml.safe_load((DASHBOARDS / "otel-collector/config.yaml").read_text())
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"metrics", "logs", "traces"}
    for pipeline in pipelines.values():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{component} is not declared in {kind}"
    exporter = config["exporters"]["prometheus"]
    assert exporter["resource_to_telemetry_conversion"]["enabled"] is True
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")


def test_prometheus_config_is_valid_for_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install -y prometheus"
    result = subprocess.run([promtool, "check", "config",
                             str(DASHBOARDS / "prometheus/prometheus.yml")],
                            capture_output=True, check=False, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    targets = json.loads((DASHBOARDS / "prometheus/targets/psyche-example.json").read_text())
    assert all(":" in address for group in targets for address in group["targets"])
