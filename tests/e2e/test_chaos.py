"""Chaos in the normal test run: the local testnet with a client SIGKILLed (and started
again at once) every 14 s until the run finishes, about 3.5 minutes. Client 1 is spared
and every client witnesses, so the run's model always has a living holder: what is
tested is that the killed ones come back, no step is counted untrained, nobody diverges
and no epoch restarts from the run's stored (initial) model. bench/chaos.py runs it
longer, with every client killable."""

from __future__ import annotations

import pytest
from e2e_helpers import events, make_testnet

from local_testnet.audit import checkpoint_agreement, hub_fallback_epochs
from local_testnet.testnet import run_headless

pytestmark = pytest.mark.slow


async def test_random_kills_lose_no_step_and_end_identical(tmp_path) -> None:
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
    # The model always had a living holder: no epoch went back to the initial model, as
    # the clients' logs, the testnet's observer and the coordinator's own count say.
    assert hub_fallback_epochs(work, 3) == [], summary
    assert summary["models_reset"] == summary["models_reset_with_holder"] == 0, summary
    assert summary["coordinator_model_resets"] == 0, summary
    # Nobody diverged.
    compared, differing = checkpoint_agreement(work, 3)
    assert compared >= 1 and differing == [], summary
    assert summary["clients_identical"], summary
