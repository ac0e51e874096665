"""A whole run with the SparseLoCo optimizer (config/local-testnet-sparseloco): the
coordinator and 3 clients, each round 4 inner AdamW steps per client and one compressed
pseudo-gradient shared; every client ends with the same weights."""

from __future__ import annotations

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails
from loopback import free_port

from local_testnet.config_variant import DEFAULT_CONFIG, write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow

SOURCE = DEFAULT_CONFIG.parent / "local-testnet-sparseloco"


async def test_three_sparseloco_clients_finish_identical(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_dir = write_config_variant(tmp_path / "config", free_port(), source=SOURCE,
                                      total_steps=12, epoch_time=25, warmup_time=20)
    testnet = Testnet(TestnetOptions(
        num_clients=3, config_path=config_dir, work_dir=tmp_path / "work",
        server_port=free_port(), metrics_base_port=free_port() - 4, timeout_s=300))
    summary = await run_headless(testnet)
    assert summary["error"] is None, f"{summary}\n{log_tails(testnet.options.work_dir)}"
    assert summary["finished"] and summary["final_step"] == 12
    assert summary["last_loss"] < summary["first_loss"] - 0.5, summary
    digests = [checkpoint_digests(testnet.options.work_dir, i) for i in (1, 2, 3)]
    assert digests[0] and digests[0] == digests[1] == digests[2]
    for i in (1, 2, 3):
        applied = events(testnet.options.work_dir, i, "applied")
        assert applied and all(e["left_out"] == 0 for e in applied), applied
        assert sum(e["results"] for e in applied) >= 2 * len(applied)
