"""bench/solana_replay_classes.py at the program's MAX_CLIENTS: every tick fits the compute
budget the tick senders ask for (ix.tick_with_budget), every report the default 200,000;
the second epoch's warm-up of 256 returning clients is the largest (about 506,000 units)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from psyche_solana.instructions import TICK_COMPUTE_UNIT_LIMIT, tick, tick_with_budget

ROOT = Path(__file__).resolve().parents[2]


def test_every_tick_and_report_of_256_clients_fits_its_budget() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.solana_replay_classes"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["clients"] == 256
    # the warm-up past the default 200,000 is what the budget instruction is for
    assert 200_000 < figures["cu_tick_warmup_second_epoch"] <= TICK_COMPUTE_UNIT_LIMIT
    assert figures["cu_report_same_class"] <= 200_000


def test_a_tick_transaction_asks_for_the_budget_first() -> None:
    from solders.keypair import Keypair

    run = Keypair().pubkey()
    budget, the_tick = tick_with_budget(run)
    assert the_tick == tick(run)
    assert str(budget.program_id) == "ComputeBudget111111111111111111111111111111"


def test_bad_client_count_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.solana_replay_classes", "--clients",
                           "999"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 2
    assert "between 3 and 256" in done.stderr and "Traceback" not in done.stderr
