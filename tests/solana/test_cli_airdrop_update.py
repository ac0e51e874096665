"""run-manager airdrop-update (issue 37 leftover): the authority of an airdrop replaces its
allocations (a new Merkle root and proofs file, the vault topped up to what they still
owe), freezes and unfreezes claims and sets its metadata, as Psyche's airdrop_update
allows; anyone else is refused by the distributor program in one line and changes
nothing. The real CLI against LiteSVM behind the local validator's JSON-RPC."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from solders.keypair import Keypair

from psyche_solana.localnet import Localnet
from run_manager.cli import app
from tests.solana.refusals import one_line_error
from tests.solana.test_cli import funded_wallet, mint_for, run_cli, runner

pytestmark = pytest.mark.timeout(60)
M = 10**6  # the mint has 6 decimals


@pytest.fixture(scope="module")
def localnet() -> Iterator[Localnet]:
    with Localnet() as net:
        yield net


def write_allocations(path: Path, rows: list[tuple[Keypair, str]]) -> Path:
    """Everything vested already (a start in the past, no duration)."""
    start = int(time.time()) - 100
    path.write_text("claimer,amount,vesting_start,vesting_duration\n" + "".join(
        f"{key.pubkey()},{amount},{start},0\n" for key, amount in rows))
    return path


def shown(net: Localnet, airdrop_id: int, proofs: Path | None = None) -> dict[str, Any]:
    argv = ["airdrop-show", "--airdrop-id", str(airdrop_id)]
    result = run_cli(net, None, *argv, *(["--proofs", str(proofs)] if proofs else []))
    assert result.exit_code == 0, result.output
    state: dict[str, Any] = json.loads(result.output)
    return state


def test_the_authority_updates_allocations_freeze_and_metadata_and_no_one_else_can(
        localnet: Localnet, tmp_path: Path) -> None:
    authority_path, authority = funded_wallet(tmp_path, "authority", localnet)
    outsider_path, outsider = funded_wallet(tmp_path, "outsider", localnet)
    (r0_path, r0), (r1_path, r1), (r2_path, r2) = (
        funded_wallet(tmp_path, f"r{i}", localnet) for i in range(3))
    mint = str(mint_for(localnet, authority, 100 * M))
    first = write_allocations(tmp_path / "first.csv", [(r0, "2"), (r1, "1")])
    old_proofs = tmp_path / "old-proofs.json"
    made = run_cli(localnet, authority_path, "airdrop-create", "--allocations", str(first),
                   "--collateral-mint", mint, "--airdrop-id", "6", "--proofs-out", str(old_proofs))
    assert made.exit_code == 0, made.output
    ok = run_cli(localnet, r0_path, "airdrop-claim", "--proofs", str(old_proofs))
    assert ok.exit_code == 0, ok.output
    before = shown(localnet, 6)
    assert before["vault"]["amount"] == 1 * M and before["total_claimed_collateral_amount"] == 2 * M

    # Someone else: refused on chain, in one line naming the program and its error.
    second = write_allocations(tmp_path / "second.csv",
                               [(r0, "3"), (r1, "1"), (r2, "4"), (outsider, "50")])
    stolen = tmp_path / "stolen-proofs.json"
    for argv in (["--freeze"], ["--metadata", "mine now"],
                 ["--allocations", str(second), "--proofs-out", str(stolen)]):
        one_line_error(run_cli(localnet, outsider_path, "airdrop-update", "--airdrop-id", "6", *argv),
                       "distributor program error 305: NotAirdropAuthority: only the airdrop's "
                       "authority may do this (sign with its wallet)")
    unchanged = shown(localnet, 6)
    assert {**unchanged, "unix_timestamp": 0} == {**before, "unix_timestamp": 0}
    assert not stolen.exists()

    # The authority: new allocations (r0 raised to 3, r2 added), a new root and proofs file,
    # the vault topped up from 1 to what they still owe: 3 + 1 + 4 - 2 claimed = 6.
    third = write_allocations(tmp_path / "third.csv", [(r0, "3"), (r1, "1"), (r2, "4")])
    new_proofs = tmp_path / "new-proofs.json"
    updated = run_cli(localnet, authority_path, "airdrop-update", "--airdrop-id", "6",
                      "--allocations", str(third), "--proofs-out", str(new_proofs))
    assert updated.exit_code == 0, updated.output
    written = json.loads(new_proofs.read_text())
    assert updated.output.splitlines() == [
        f"merkle root {written['merkle_root']}",
        f"airdrop 6 updated: 3 allocations of {8 * M} base units, proofs in {new_proofs}, "
        f"vault topped up by {5 * M}"]
    after = shown(localnet, 6)
    assert after["merkle_root"] == written["merkle_root"] != before["merkle_root"]
    assert after["vault"]["amount"] == 6 * M
    assert written["airdrop_id"] == 6 and written["collateral_mint"] == mint

    # The old proofs no longer match; the new ones pay r0 only what it was not paid yet.
    one_line_error(run_cli(localnet, r1_path, "airdrop-claim", "--proofs", str(old_proofs)),
                   "does not match airdrop 6's Merkle root")
    ok = run_cli(localnet, r0_path, "airdrop-claim", "--proofs", str(new_proofs))
    assert ok.exit_code == 0 and ok.output.strip() == f"claimed {1 * M} base units from airdrop 6"

    # Freeze, a refused claim, unfreeze, the claim; metadata.
    frozen = run_cli(localnet, authority_path, "airdrop-update", "--airdrop-id", "6", "--freeze")
    assert frozen.output.strip() == "airdrop 6 updated: claims frozen", frozen.output
    assert shown(localnet, 6)["claim_freeze"] is True
    one_line_error(run_cli(localnet, r2_path, "airdrop-claim", "--proofs", str(new_proofs)),
                   "distributor", "AirdropClaimsFrozen")
    thawed = run_cli(localnet, authority_path, "airdrop-update", "--airdrop-id", "6",
                     "--unfreeze", "--metadata", "round 2")
    assert thawed.output.strip() == "airdrop 6 updated: claims allowed; metadata set", thawed.output
    for path in (r1_path, r2_path):
        ok = run_cli(localnet, path, "airdrop-claim", "--proofs", str(new_proofs))
        assert ok.exit_code == 0, ok.output
    final = shown(localnet, 6, new_proofs)
    assert final["metadata"] == "round 2" and final["claim_freeze"] is False
    assert [a["claimed"] for a in final["allocations"]] == [3 * M, 1 * M, 4 * M]
    assert final["vault"]["amount"] == 0  # the top-up was exactly what was owed


def test_airdrop_update_refuses_bad_input_in_one_line(localnet: Localnet, tmp_path: Path) -> None:
    wallet, _ = funded_wallet(tmp_path, "someone", localnet)
    result = run_cli(localnet, wallet, "airdrop-update", "--airdrop-id", "6")
    assert result.exit_code == 2
    one_line_error(result, "nothing to change")
    one_line_error(run_cli(localnet, wallet, "airdrop-update", "--airdrop-id", "424243", "--freeze"),
                   "no airdrop with id 424243")
    result = run_cli(localnet, wallet, "airdrop-update", "--airdrop-id", "6", "--metadata", "x" * 301)
    assert result.exit_code == 2
    one_line_error(result, "at most 300")


def test_airdrop_update_has_help() -> None:
    result = runner.invoke(app, ["airdrop-update", "-h"])
    assert result.exit_code == 0, result.output
    for word in ("--airdrop-id", "--allocations", "--proofs-out", "--no-fund", "--freeze",
                 "--unfreeze", "--metadata"):
        assert word in result.output
