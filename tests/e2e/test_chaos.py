"""Chaos in the normal test run: the local testnet with a client SIGKILLed (and started
again at once) every 14 s until the run finishes, about 3.5 minutes. Client 1 is spared
and every client witnesses, so the run's model always has a living holder: what is
tested is that the killed ones come back with it, lose no step and never diverge (when
every holder dies, Psyche falls back to the run's stored checkpoint by design; how often
that happens under harsher chaos is what bench/chaos.py measures)."""

from __future__ import annotations

import pytest
from e2e_helpers import REPO, events, make_testnet

from local_testnet.audit import checkpoint_agreement, hub_fallback_epochs, models_reset
from local_testnet.testnet import run_headless

pytestmark = pytest.mark.slow
INITIAL_MODEL = REPO / "assets" / "tiny-llama" / "model.safetensors"


async def test_random_kills_lose_no_step_reset_no_model_and_end_identical(tmp_path) -> None:
    testnet = make_testnet(tmp_path, 3, random_kill_num=1, random_kill_interval_s=14,
                           allowed_to_kill=[2, 3], client_args=["--keep-steps", "1000"],
                           config={"total_steps": 30, "epoch_time": 15, "warmup_time": 10,
                                   "max_round_train_time": 4, "init_min_clients": 3,
                                   "witness_nodes": 0})
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None and summary["finished"], summary
    assert summary["killed"] >= 6 and summary["final_step"] == 30, summary
    # No step was counted with its data skipped: each had a client training it.
    assert testnet.untrained_steps() == [], (testnet.trainable, summary)
    # Killed clients came back into the run and trained again.
    assert summary["rejoined"] >= 2, summary
    assert all(events(work, i, "trained") for i in (2, 3))
    # No epoch fell back to the stored (initial) model, nobody silently went back to it,
    # and nobody diverged.
    assert hub_fallback_epochs(work, 3) == [], summary
    reset, examined = models_reset(work, 3, INITIAL_MODEL)
    assert examined >= 3 and reset == 0, summary
    compared, differing = checkpoint_agreement(work, 3)
    assert compared >= 1 and differing == [], summary
    assert summary["clients_identical"], summary
