"""No RUN_ID: the run-manager picks a run the wallet may join, as Psyche's does, on a real
local validator (JSON-RPC on loopback) with runs that are open, halted, closed to the
wallet, or open through a delegate."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from typer.testing import CliRunner

from coordinator import load_state_file
from psyche_solana import instructions as ix
from psyche_solana.ids import program_id
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import admin, authorize, create_run, find_run, update_instructions
from run_manager.cli import app
from run_manager.discovery import NoJoinableRun, pick_run

runner = CliRunner()
STATE = Path(__file__).resolve().parents[2] / "config/local-testnet/state.toml"
USER = Keypair()
OPEN, CLOSED, DELEGATOR, GRANTEE = Keypair(), Keypair(), Keypair(), Keypair()


async def open_run(rpc: SolanaRpc, owner: Keypair, run_id: str, resume: bool) -> None:
    await create_run(rpc, owner, run_id, "v1")
    run = await find_run(rpc, run_id)
    instructions = update_instructions(run, owner.pubkey(), load_state_file(STATE), None)
    if resume:
        instructions.append(ix.set_paused(run.address, owner.pubkey(), False))
    await admin(rpc, run, owner, instructions)


@pytest.fixture(scope="module")
def localnet() -> Iterator[Localnet]:
    """open: permissionless; halted: permissionless but never resumed; closed: no
    authorization; delegated: an authorization for GRANTEE, who lists USER as delegate."""
    with Localnet() as net:
        async def setup() -> None:
            async with SolanaRpc([net.url]) as rpc:
                for key in (OPEN, CLOSED, DELEGATOR, GRANTEE):
                    await rpc.airdrop(key.pubkey(), 50 * 10**9)
                await authorize(rpc, OPEN, Pubkey.default())
                await open_run(rpc, OPEN, "open", resume=True)
                await open_run(rpc, OPEN, "halted", resume=False)
                await open_run(rpc, CLOSED, "closed", resume=True)
                await open_run(rpc, DELEGATOR, "delegated", resume=True)
                address = await authorize(rpc, DELEGATOR, GRANTEE.pubkey())
                await rpc.send_instructions([ix.authorization_grantee_update(
                    GRANTEE.pubkey(), address, False, [USER.pubkey()])], GRANTEE)

        asyncio.run(setup())
        yield net


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops `run-manager --env-file` right after the run is picked (no Docker here)."""
    from run_manager import engine

    def connect(timeout_s: float = 30.0) -> None:
        raise engine.EngineError("stopped after picking the run")

    monkeypatch.setattr(engine, "connect", connect)


def test_the_wallet_gets_the_running_run_it_may_join(localnet: Localnet) -> None:
    chosen, candidates = pick_run([localnet.url], USER.pubkey(), None, None)
    assert [run.run_id for run in candidates] == ["open"]
    assert chosen.grantee == Pubkey.default()  # joins through the permissionless grant
    assert chosen.describe() == "open (WaitingForMembers, 0/1 waiting)"


def test_authorizer_filters_by_join_authority_and_a_delegate_grant_counts(localnet: Localnet) -> None:
    chosen, candidates = pick_run([localnet.url], USER.pubkey(), DELEGATOR.pubkey(),
                                  GRANTEE.pubkey())
    assert [run.run_id for run in candidates] == ["delegated"]
    assert chosen.grantee == GRANTEE.pubkey()
    with pytest.raises(NoJoinableRun, match=f"whose join authority is {CLOSED.pubkey()}"):
        pick_run([localnet.url], USER.pubkey(), CLOSED.pubkey(), None)


def test_without_run_id_the_cli_says_which_run_it_picked(localnet: Localnet, tmp_path: Path,
                                                         no_engine: None) -> None:
    env = tmp_path / "run.env"
    wallet = f"RPC={localnet.url}\nWS_RPC=ws://127.0.0.1:1\nRAW_WALLET_PRIVATE_KEY={USER}\n"
    env.write_text(wallet)
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "v1"])
    assert result.exit_code == 1 and "stopped after picking the run" in result.output
    assert f"RUN_ID not set: 1 run(s) open to wallet {USER.pubkey()}:" in result.output
    assert (f"selected run open (WaitingForMembers, 0/1 waiting); joining with "
            f"AUTHORIZER={Pubkey.default()}") in result.output
    # AUTHORIZER (the grantee whose delegate the wallet is) opens one more run; Psyche's
    # --authorizer keeps the runs of one join authority.
    env.write_text(f"{wallet}AUTHORIZER={GRANTEE.pubkey()}\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "v1",
                                 "--authorizer", str(DELEGATOR.pubkey())])
    assert f"selected run delegated (WaitingForMembers, 0/1 waiting); joining with " \
           f"AUTHORIZER={GRANTEE.pubkey()}" in result.output


def test_with_run_id_set_authorizer_is_not_used_and_says_so(localnet: Localnet, tmp_path: Path,
                                                            no_engine: None) -> None:
    env = tmp_path / "run.env"
    env.write_text(f"RPC={localnet.url}\nWS_RPC=ws://127.0.0.1:1\nRAW_WALLET_PRIVATE_KEY={USER}\n"
                   "RUN_ID=closed\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "v1",
                                 "--authorizer", str(OPEN.pubkey())])
    assert "--authorizer only filters the runs picked when RUN_ID is not set" in result.output
    assert "selected run" not in result.output


@pytest.fixture
def restore_program_id(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # setenv records the variable's state before (absent, normally) for undo to restore;
    # the CLI's --coordinator-program-id then overwrites it in os.environ.
    monkeypatch.setenv("PSYCHE_COORDINATOR_PROGRAM_ID", str(program_id("coordinator")))
    yield
    monkeypatch.undo()
    program_id.cache_clear()  # the CLI cached the override; later tests need ours back


def test_nothing_to_join_or_no_cluster_is_one_line(localnet: Localnet, tmp_path: Path,
                                                   no_engine: None, restore_program_id: None) -> None:
    env = tmp_path / "run.env"
    env.write_text(f"RPC={localnet.url}\nWS_RPC=ws://127.0.0.1:1\nRAW_WALLET_PRIVATE_KEY={USER}\n")
    other = str(Keypair().pubkey())
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "v1",
                                 "--coordinator-program-id", other])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("run-manager: RUN_ID is not set and no run of coordinator program "
                           f"{other} is open to wallet {USER.pubkey()}")

    env.write_text(f"RPC=http://127.0.0.1:9\nWS_RPC=ws://127.0.0.1:1\nRAW_WALLET_PRIVATE_KEY={USER}\n")
    result = runner.invoke(app, ["--env-file", str(env), "--no-tui", "--client-version", "v1"])
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("run-manager: RUN_ID is not set and the runs could not be listed")


def test_the_picked_run_and_grantee_reach_the_container(localnet: Localnet, tmp_path: Path) -> None:
    from run_manager.cli import settings_with_chosen_run
    from run_manager.runner import RunOptions, supervisor_config
    from run_manager.settings import load_settings

    env = tmp_path / "run.env"
    env.write_text(f"RPC={localnet.url}\nWS_RPC=ws://127.0.0.1:1\nRAW_WALLET_PRIVATE_KEY={USER}\n")
    config = supervisor_config(settings_with_chosen_run(load_settings(env), None), RunOptions())
    assert config.run_id == "open"
    assert config.environment["RUN_ID"] == "open"
    assert config.environment["AUTHORIZER"] == str(Pubkey.default())
