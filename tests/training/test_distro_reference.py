"""DisTrO against what the code produced before its step was unified and grouped: the same
payload bytes and the same weights, step by step, for the fixed seed of
tests/training/distro_reference.py (fixture: fixtures/distro_reference.json), both under
the pinned CPU numerics of reproducible_numerics.py, so that they hold on any x86 CPU."""

import json
from pathlib import Path

from distro_reference import FIXTURE
from reproducible_numerics import run_reproducibly

RECORDER = Path(__file__).parent / "distro_reference.py"


def test_payloads_and_weights_match_the_recorded_reference():
    recorded = json.loads(FIXTURE.read_text())
    now = json.loads(run_reproducibly(RECORDER, "--print"))
    assert now.keys() == recorded.keys()
    for case, expected in recorded.items():
        for what, hashes in expected.items():
            assert now[case][what] == hashes, f"{case}: {what} differ from the reference"
    # both apply paths (decoded results, wire bytes) give the same weights
    for case in ("trainer_one_bit", "trainer_values", "trainer_token_rows"):
        assert now[case]["weights"] == now[case]["weights_streamed"]
