"""DisTrO against what the code produced before its step was unified and grouped: the same
payload bytes and the same weights, step by step, for the fixed seed of
tests/training/distro_reference.py (fixture: fixtures/distro_reference.json)."""

import json

from distro_reference import FIXTURE, record


def test_payloads_and_weights_match_the_recorded_reference():
    recorded = json.loads(FIXTURE.read_text())
    now = record()
    assert now.keys() == recorded.keys()
    for case, expected in recorded.items():
        for what, hashes in expected.items():
            assert now[case][what] == hashes, f"{case}: {what} differ from the reference"
    # both apply paths (decoded results, wire bytes) give the same weights
    for case in ("trainer_one_bit", "trainer_values", "trainer_token_rows"):
        assert now[case]["weights"] == now[case]["weights_streamed"]
