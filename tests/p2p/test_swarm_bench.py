"""bench/swarm.py runs a 4-client swarm end to end and prints its JSON line last."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWARM = ["-m", "bench.swarm"]  # run from ROOT, as every benchmark


@pytest.mark.timeout(90)
def test_a_four_client_swarm_reports_its_figures_and_the_producer_uploads_less_than_n_minus_1(
) -> None:
    result = subprocess.run([sys.executable, *SWARM, "--sizes", "4", "--rounds", "1"],
                            capture_output=True, check=False, text=True, timeout=80, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("producer_upload_results_n4", "download_overhead_pct_n4",
                "max_serve_over_mean_n4", "up_bytes_per_client_round_n4"):
        assert key in figures, key
    assert 1 <= figures["producer_upload_results_n4"] < 3  # N - 1 = 3 before this change
    assert figures["down_bytes_per_client_round_n4"] == 3 * figures["result_bytes"]
    assert figures["download_overhead_pct_n4"] == 0


def test_bad_sizes_are_a_one_line_error() -> None:
    result = subprocess.run([sys.executable, *SWARM, "--sizes", "4,x"],
                            capture_output=True, check=False, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    assert "--sizes wants numbers like 4,16,64" in result.stderr
    assert "Traceback" not in result.stderr
