"""Verification in a real local run (coordinator over TCP, real clients, the tiny model):
with `verification_percent` = 67 every client of 3 is followed by both others; an honest
run reports nobody and ends with identical models; a client publishing dishonest results
(`--test-adversary random_signs`) is reported by its two followers, ejected, and left out,
while the honest clients go on and end identical."""

from __future__ import annotations

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails, make_testnet

from local_testnet.testnet import run_headless

pytestmark = pytest.mark.slow

CONFIG = {"total_steps": 12, "epoch_time": 30, "warmup_time": 25, "verification_percent": 67,
          "min_clients": 2}


async def test_an_honest_run_with_verification_reports_no_one_and_ends_identical(
        tmp_path) -> None:
    testnet = make_testnet(tmp_path, 3, config=CONFIG)
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    assert summary["finished"] and summary["final_step"] == 12, summary
    verified = [e for i in (1, 2, 3) for e in events(work, i, "result_verified")]
    assert len(verified) >= 6 and all(e["ok"] for e in verified), verified
    assert not any(events(work, i, "verification_report") for i in (1, 2, 3))
    following = {i: events(work, i, "following") for i in (1, 2, 3)}
    assert all(f and len(f[0]["trainers"]) == 2 for f in following.values()), following
    digests = [checkpoint_digests(work, i) for i in (1, 2, 3)]
    assert digests[0] and digests[0] == digests[1] == digests[2], digests


async def test_a_dishonest_client_is_reported_ejected_and_left_out(tmp_path) -> None:
    testnet = make_testnet(tmp_path, 3, config=CONFIG,
                           client_args_of={3: ["--test-adversary", "random_signs"]})
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    cheat = events(work, 3, "started")[0]["identity"]
    reports = [e for i in (1, 2) for e in events(work, i, "verification_report")]
    assert {e["accused"] for e in reports} == {cheat}, reports
    assert {i for i in (1, 2) if events(work, i, "verification_report")} == {1, 2}
    ejected = events(work, 3, "ejected")
    assert ejected and len(ejected[0]["reporters"]) == 2, f"{ejected}\n{log_tails(work)}"
    # nobody ever fails an honest client's result
    for i in (1, 2, 3):
        assert all(e["ok"] for e in events(work, i, "result_verified") if e["trainer"] != cheat)
    left_out = [e for i in (1, 2) for e in events(work, i, "result_left_out")]
    assert all(e["trainer"] == cheat for e in left_out), left_out
    digests = [checkpoint_digests(work, i) for i in (1, 2)]
    assert digests[0] and digests[0] == digests[1], digests
    assert summary["last_loss"] < summary["first_loss"], summary
