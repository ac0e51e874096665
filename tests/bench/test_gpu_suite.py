"""The GPU suite (bench/gpu_suite.sh) on the CPU with --smoke: the same scripts, parts and
JSON line a GPU call runs, at tiny sizes, so that they cannot rot while no GPU is at hand."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "gpu_suite.sh"

pytestmark = pytest.mark.slow


def run_suite(call: str, results: Path, *, env: dict[str, str] | None = None,
              timeout: float = 420) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    done = subprocess.run(
        [str(SUITE), call, "--smoke", "--results-dir", str(results)],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "GPU_SUITE_COMMIT": "test", **(env or {})})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(line, dict)
    return line, done


def test_speed_smoke_prints_and_writes_every_figure(tmp_path: Path) -> None:
    figures, done = run_suite("speed", tmp_path)
    assert figures["errors"] == {}, done.stdout[-4000:]
    written = tmp_path / "gpu_suite_speed_cpu_test.json"
    assert json.loads(written.read_text()) == figures
    assert (figures["call"], figures["device_slug"], figures["smoke"]) == ("speed", "cpu", True)
    assert figures["tokens_per_s"] > 0 and figures["peak_mem_gib"] > 0
    assert figures["mfu"] is None  # no bf16 peak for a CPU
    assert 0 < figures["distro_overhead_pct"] < 10_000
    assert 0 < figures["plan_over_peak"] < 10
    assert figures["micro_batch"] >= 1 and figures["peers"] == 2
    assert figures["apply_s_64"] > 0 and figures["apply_peak_extra_gib_64"] >= 0
    assert figures["apply_peers"] == 4
    # two clients on one machine end bit-identical, and they learnt
    assert figures["testnet_clients_identical"] is True
    assert figures["testnet_loss_fell"] is True
    assert figures["testnet_last_loss"] < figures["testnet_first_loss"]
    # an honest replay at another micro-batch size is near, not necessarily at, zero
    for name in ("gpu_replay_jaccard", "gpu_replay_hamming", "gpu_replay_manhattan"):
        assert 0 <= figures[name] < 0.5, (name, figures[name])
    assert isinstance(figures["docker"], str) and figures["docker"]
    table = (tmp_path / "gpu_suite_speed_cpu_test_profile.txt").read_text()
    assert "aten::" in table and "Self CPU" in table


def test_learn_smoke_compares_the_methods(tmp_path: Path) -> None:
    figures, done = run_suite("learn", tmp_path)
    assert figures["errors"] == {} and figures["learn_errors"] == {}, done.stdout[-4000:]
    assert (tmp_path / "gpu_suite_learn_cpu_test.json").exists()
    assert figures["methods"] == ["adamw", "distro"]
    assert figures["learn_steps"] == 2
    assert figures["learn_tokens_per_method"] == 2 * 8 * 64
    for method in ("adamw", "distro"):
        assert 0 < figures[f"{method}_val_loss"] < 20
    assert figures["distro_loss_ratio"] == pytest.approx(
        figures["distro_val_loss"] / figures["adamw_val_loss"], abs=1e-3)
    # DisTrO sends far fewer bytes per token than the dense fp32 all-reduce
    assert figures["distro_bytes_per_token"] < figures["adamw_bytes_per_token"] / 100
    # and its bytes ratio over the dense baseline is optimizers.py's (AdamW's is 1)
    assert figures["adamw_bytes_ratio"] == 1.0 and figures["distro_bytes_ratio"] > 100


def test_a_python_without_torch_still_writes_the_line(tmp_path: Path) -> None:
    """A fake torch first on PYTHONPATH (this machine has a real one): every part says what
    is missing, the call still prints and writes its JSON line."""
    shim = tmp_path / "no_torch"
    shim.mkdir()
    (shim / "torch.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    figures, _ = run_suite("speed", tmp_path / "results", env={"PYTHONPATH": str(shim)},
                           timeout=120)
    assert figures["tokens_per_s"] is None and figures["testnet_loss_fell"] is None
    assert set(figures["errors"]) >= {"plan", "train", "apply", "replay", "testnet"}
    assert all("missing Python module 'torch'" in figures["errors"][part]
               for part in ("plan", "train", "apply", "replay"))
    assert (tmp_path / "results" / "gpu_suite_speed_unknown_test.json").exists()


def test_an_unknown_call_is_one_usage_line() -> None:
    done = subprocess.run([str(SUITE), "fast"], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "usage: bench/gpu_suite.sh speed|learn [--smoke] | wheels"


def test_steps_that_fit_the_budget() -> None:
    from bench import gpu_learn

    # 300 s left, 20 s of set-up, 0.5 s a step: (300 - 24 - 10) / 0.5 / 1.15 = 462 -> 448
    assert gpu_learn.steps_that_fit(0.5, 20, 300, 16, 100_000) == 448
    assert gpu_learn.steps_that_fit(0.5, 20, 300, 16, 100) == 96  # --max-steps, rounded down
    assert gpu_learn.steps_that_fit(50.0, 20, 300, 16, 100_000) == 16  # at least one round
