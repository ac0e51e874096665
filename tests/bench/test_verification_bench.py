"""bench/verification.py --smoke: the honest-noise sweep, the attacks and the loss run at
tiny sizes, so that its JSON line and its zero false positives cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_verification_smoke_prints_every_field_and_no_false_positive() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.verification", "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    for field in ("false_positive_rate", "honest_p99_jaccard", "honest_p99_hamming",
                  "honest_p99_manhattan", "min_detected_sign_flip_pct", "min_detected_scale",
                  "min_detected_lazy_pct", "loss_with_attacker_vs_clean",
                  "detect_rate_sign_flip_0.5", "detect_rate_sign_flip_1",
                  "detect_rate_sign_flip_5", "detect_rate_lazy_90", "detect_rate_partial_copy",
                  "detect_rate_stale", "detect_rate_copy_pos0", "detect_rate_copy_pos1"):
        assert field in line, field
    assert line["honest_verifications"] > 0
    assert line["false_positive_rate"] == 0.0, done.stdout[-4000:]
    # ... and none with the limits the client ships (on seed 0 of the tiny swarm)
    assert line["false_positive_rate_client"] == 0.0, done.stdout[-4000:]
    assert line["gross_min_detect_rate_declared"] == 1.0
    # gross attacks and the copier ahead of its original are caught in any run
    for gross in ("random_signs", "zeros", "stale", "copy_pos0"):
        assert line[f"detect_rate_{gross}"] == 1.0, gross
    assert line["copy_originals_left_out"] > 0  # the screen leaves out the pair, not one
    assert 0.9 < line["loss_with_attacker_vs_clean"] < 1.5
    assert "honest replay distances, by source" in done.stdout


def test_verification_rejects_bad_arguments_in_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.verification", "--peers", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "needs --steps >= 3" in done.stderr and "Traceback" not in done.stderr
