"""A client split over two ranks (--data-parallelism 2: two processes, FSDP2 over gloo)
trains in a run beside one-device clients, and every model ends bit-identical."""

from __future__ import annotations

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails, make_testnet

from local_testnet.testnet import run_headless

pytestmark = pytest.mark.slow


async def test_a_two_rank_client_and_one_device_clients_end_identical(tmp_path) -> None:
    testnet = make_testnet(tmp_path, 3, client_args_of={1: ["--data-parallelism", "2"]},
                           config={"total_steps": 12, "epoch_time": 30, "warmup_time": 25})
    summary = await run_headless(testnet)

    assert summary["error"] is None, f"{summary}\n{log_tails(testnet.options.work_dir)}"
    assert summary["finished"] and summary["final_step"] == 12
    assert summary["last_loss"] < summary["first_loss"], summary
    # The two-rank client trained its share of rounds, and its results were applied by
    # the others like anyone's: every checkpoint of every client is the same bytes.
    trained = {i: {e["step"] for e in events(testnet.options.work_dir, i, "trained")}
               for i in (1, 2, 3)}
    assert len(trained[1]) >= 5, trained
    ranks = {i: {e["ranks"] for e in events(testnet.options.work_dir, i, "trained")}
             for i in (1, 2, 3)}
    assert ranks == {1: {2}, 2: {1}, 3: {1}}, ranks
    digests = [checkpoint_digests(testnet.options.work_dir, i) for i in (1, 2, 3)]
    assert digests[0], digests
    assert digests[0] == digests[1] == digests[2], digests
