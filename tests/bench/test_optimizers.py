"""bench/optimizers.py --smoke trains every method (DiLoCo and DeMo included), tunes each on
one half of the validation split, and ends with the JSON line the optimizer issue names."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("adamw", "distro", "distro_tuned", "sparseloco", "diloco", "demo")


def run_bench(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.optimizers", *args],
                          capture_output=True, text=True, timeout=600, check=check, cwd=ROOT)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict]]:
    jsonl = tmp_path_factory.mktemp("optimizers") / "outcomes.jsonl"
    result = run_bench("--smoke", "--jsonl", str(jsonl))
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return figures, records


def test_smoke_prints_every_field_finite(smoke):
    figures, _ = smoke
    keys = [f"{m}_{field}" for m in METHODS for field in ("val_loss", "val_loss_spread",
                                                           "bytes_ratio")]
    keys += [f"{m}_loss_ratio" for m in METHODS[1:]]
    keys += ["sparseloco_vs_diloco", "distro_vs_demo", "distro_tuned_vs_demo"]
    for key in keys:
        assert isinstance(figures[key], float | int) and math.isfinite(figures[key]), key
        assert figures[key] >= 0, key
    for key in ("diloco_val_loss", "demo_val_loss", "sparseloco_vs_diloco", "distro_vs_demo"):
        assert figures[key] > 0, key
    assert figures["seeds"] == [0, 1] and figures["peers"] == 4 and figures["threads"] == 1


def test_ratios_are_the_per_seed_means(smoke):
    figures, _ = smoke
    for key, (top, bottom) in {"sparseloco_vs_diloco": ("sparseloco", "diloco"),
                               "distro_vs_demo": ("distro", "demo"),
                               "distro_tuned_vs_demo": ("distro_tuned", "demo")}.items():
        per_seed = [f[f"{top}_val_loss"] / f[f"{bottom}_val_loss"] for f in figures["per_seed"]]
        assert figures[key] == pytest.approx(sum(per_seed) / len(per_seed), abs=2e-4), key


def test_bytes_ratios_count_each_methods_rounds(smoke):
    figures, _ = smoke
    assert figures["adamw_bytes_ratio"] == 1.0
    # DiLoCo sends every parameter in fp32 once per inner_steps steps.
    assert figures["diloco_bytes_ratio"] == pytest.approx(figures["inner_steps"])
    seed0 = figures["per_seed"][0]
    # SparseLoCo's round carries inner_steps steps' samples: its bytes count per token.
    assert seed0["sparseloco_bytes_ratio"] == pytest.approx(
        4 * figures["params"] * figures["inner_steps"] / seed0["sparseloco_bytes_per_round"],
        rel=1e-3)
    # DeMo: 32 values (bf16) and indices (u16) per 64 x 64 block, once per step.
    assert seed0["demo_bytes_ratio"] == pytest.approx(
        4 * figures["params"] / seed0["demo_bytes_per_round"], rel=1e-3)
    assert 100 < figures["demo_bytes_ratio"] < figures["distro_bytes_ratio"]


def test_every_method_gets_the_same_grid_and_keeps_its_best(smoke):
    figures, records = smoke
    tuning = figures["tuning"]
    assert {m: len(tuning[m]) for m in METHODS} == {
        m: 1 if m == "distro" else figures["grid_points"] for m in METHODS}
    for method in METHODS:
        chosen = min(tuning[method], key=tuning[method].get)
        assert figures[f"{method}_setting"] == chosen
        # The other seeds ran only the chosen setting; the figures are on the other half.
        later = [r for r in records if r["method"] == method and r["seed"] == 1]
        assert [r["setting"] for r in later] == [chosen]
        reported = [r["val_loss"] for r in records
                    if r["method"] == method and r["setting"] == chosen]
        assert figures[f"{method}_val_loss"] == pytest.approx(sum(reported) / len(reported),
                                                              abs=2e-4)


def test_from_jsonl_gives_the_same_summary(smoke, tmp_path):
    figures, records = smoke
    jsonl = tmp_path / "outcomes.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    again = json.loads(run_bench("--smoke", "--from-jsonl", str(jsonl)).stdout.splitlines()[-1])
    for key in ("sparseloco_vs_diloco", "distro_vs_demo", "distro_tuned_vs_demo",
                "diloco_setting", "per_seed"):
        assert again[key] == figures[key], key


def test_too_many_validation_samples_is_one_clear_line():
    result = run_bench("--smoke", "--val-samples", "100000", check=False)
    assert result.returncode == 2
    assert "validation sequences" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
