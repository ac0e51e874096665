"""run-manager's Solana subcommands that complete Psyche's set (join-authorization-read,
close-run, checkpoint, ...), against the local validator on loopback."""

from __future__ import annotations

import json

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from psyche_solana.localnet import Localnet
from tests.solana.test_cli import _cli, _wallet


@pytest.fixture(scope="module")
def localnet():
    with Localnet() as net:
        yield net


def test_join_authorization_read_and_a_second_create(localnet, tmp_path):
    owner_path, owner = _wallet(tmp_path, "owner", localnet)
    grantee = Keypair().pubkey()
    none = _cli(localnet, None, "join-authorization-read", "--join-authority", str(owner.pubkey()),
                "--authorizer", str(grantee))
    assert none.exit_code == 1
    assert f"no authorization from {owner.pubkey()} for {grantee}" in none.output
    assert _cli(localnet, owner_path, "join-authorization-create", "--authorizer",
                str(grantee)).exit_code == 0
    read = _cli(localnet, None, "join-authorization-read", "--join-authority", str(owner.pubkey()),
                "--authorizer", str(grantee))
    assert read.exit_code == 0, read.output
    shown = json.loads(read.output)
    assert shown["grantor"] == str(owner.pubkey()) and shown["grantee"] == str(grantee)
    assert shown["active"] is True and shown["scope"] == "CoordinatorJoinRun"
    assert shown["permissionless"] is False and shown["delegates"] == []

    again = _cli(localnet, owner_path, "join-authorization-create", "--authorizer", str(grantee))
    assert again.exit_code == 1
    assert "already exists (active)" in again.output and "Traceback" not in again.output
    assert len(again.output.strip().splitlines()) == 1

    permissionless = _cli(localnet, None, "join-authorization-read", "--join-authority",
                          str(owner.pubkey()))
    assert permissionless.exit_code == 1 and str(Pubkey.default()) in permissionless.output
    bad = _cli(localnet, None, "join-authorization-read", "--join-authority", "nope")
    assert bad.exit_code == 2 and "--join-authority is not a base-58 public key" in bad.output
