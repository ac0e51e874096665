"""bench/sparseloco_frontier.py on the committed runs: the ratio is the per-seed mean of
SparseLoCo's val loss over DiLoCo's, and the table and plot are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def test_frontier_of_the_committed_runs(tmp_path: Path) -> None:
    best = RESULTS / "optimizers_sparseloco_best_2cores.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "bench.sparseloco_frontier", "--diloco", str(best),
         "--point", f"1/40={best}", "--point",
         f"1/64={RESULTS / 'sparseloco_frontier_d1-64.jsonl'}", "--out", str(tmp_path / "f")],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    rows = {row["label"]: row for row in json.loads(done.stdout.strip().splitlines()[-1])}
    records = [json.loads(line) for line in best.read_text().splitlines()]
    chosen = {(r["method"], r["seed"]): r["val_loss"] for r in records
              if r["setting"] in ("outer lr 3.3333", "plain average")}
    expected = sum(chosen[("sparseloco", s)] / chosen[("diloco", s)] for s in (0, 1, 2)) / 3
    assert rows["1/40"]["seeds"] == [0, 1, 2]
    assert abs(rows["1/40"]["sparseloco_vs_diloco"] - expected) < 1e-4
    assert rows["1/64"]["seeds"] == [0] and rows["1/64"]["bytes_ratio"] > 1500
    assert "| 1/40 | 0 1 2 |" in (tmp_path / "f.md").read_text()
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_a_point_without_a_label_is_one_clear_line(tmp_path: Path) -> None:
    best = RESULTS / "optimizers_sparseloco_best_2cores.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "bench.sparseloco_frontier", "--diloco", str(best),
         "--point", str(best)], capture_output=True, text=True, cwd=ROOT, timeout=60,
        check=False)
    assert done.returncode == 2 and "is not LABEL=FILE" in done.stderr
