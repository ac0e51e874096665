"""bench/distro.py runs end to end with tiny parameters and ends with its JSON line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_distro_prints_its_figures_as_a_last_json_line():
    result = subprocess.run(
        [sys.executable, "-m", "bench.distro", "--steps", "3", "--peers", "2",
         "--total-batch", "4", "--micro-batch", "2", "--seq-len", "32", "--val-samples", "4"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["params"] == 1_901_696
    # chunk 64, top-k 8, 1-bit: ~13 bytes per 4096 parameters plus small headers.
    assert figures["compression_ratio"] > 1000
    assert figures["dense_fp32_bytes_per_step"] == 4 * figures["params"]
    for key in ("val_loss_distro", "val_loss_adamw", "loss_ratio", "optimizer_overhead_pct"):
        assert figures[key] > 0


def test_bench_train_step_prints_its_figures_as_a_last_json_line():
    result = subprocess.run(
        [sys.executable, "-m", "bench.train_step", "--device", "cpu",
         "--steps", "2", "--batch", "2", "--micro-batch", "1", "--seq-len", "32",
         "--loss-steps", "12", "--distro-cost-size", "none"],
        capture_output=True, text=True, timeout=300, check=True, cwd=ROOT,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["device"], figures["dtype"], figures["params"]) == ("cpu", "fp32", 1_901_696)
    assert figures["mfu"] is None  # no bf16 peak for a CPU
    assert figures["tokens_per_s"] > 0 and figures["peak_mem_mb"] > 0
    assert 0 < figures["distro_overhead_pct"] < 1000
    for key in ("bf16_vs_fp32_loss_ratio", "bf16_buffers_vs_fp32_loss_ratio"):
        assert 0.5 < figures[key] < 2, figures
    # bench/distro_step_cost.py's fields, skipped here (measured in test_distro_step.py)
    for key in ("distro_ops_per_step", "distro_ops_growth", "distro_step_over_fwd_bwd_125m"):
        assert key in figures and figures[key] is None


def test_bench_distro_frontier_writes_its_table_and_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.distro_frontier", "--steps", "3",
         "--peers", "2", "--total-batch", "4", "--micro-batch", "2", "--seq-len", "32",
         "--val-samples", "4", "--only", "psyche", "decay 0.95, top-k 16", "--out",
         str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=True, cwd=ROOT,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures["settings"]) == {"psyche", "decay 0.95, top-k 16"}
    settings = figures["settings"]
    assert settings["decay 0.95, top-k 16"]["bytes_per_step"] > settings["psyche"]["bytes_per_step"]
    table = (tmp_path / "distro_frontier.md").read_text()
    assert "| psyche |" in table and "| decay 0.95, top-k 16 |" in table
    assert (tmp_path / "distro_frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
