"""bench/p2p.py runs end to end with tiny parameters and prints its JSON line last."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_bench_p2p_prints_its_figures_as_the_last_json_line() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.p2p",
            "--size-mib=2",
            "--parallel-streams=2",
            "--gossip-nodes=4",
            "--gossip-messages=2",
            "--gossip-round-gap-s=0.05",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("blob_mb_s", "tcp_mb_s", "ratio", "gossip_p99_ms", "blob_parallel_mb_s"):
        assert figures[key] > 0, key
    assert figures["bulk_write_patch"] is True
    assert figures["ratio"] == pytest.approx(figures["blob_mb_s"] / figures["tcp_mb_s"], rel=0.01)


def test_importing_the_p2p_package_does_not_load_torch() -> None:
    code = "import sys, client_image.p2p; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
