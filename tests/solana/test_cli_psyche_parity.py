"""run-manager's subcommands taking what Psyche's take (tools/rust-tools/run-manager):
`list-runs` lists the runs this wallet can join as Psyche's table (`--env-file`,
`--authorizer`; `--all` for every run), `can-join` / `json-dump-user` take `--wallet` and
`--user` for `--address`, `join-authorization-delegate` takes `--delegate-added`, and
`print-all-help --markdown` prints every command's help. Against the local validator on
loopback; print-all-help as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from solders.keypair import Keypair

from psyche_solana.localnet import Localnet
from run_manager.cli import app
from tests.solana.test_cli import STATE, funded_wallet, run_cli

RUN_MANAGER = [sys.executable, "-c", "from run_manager.cli import main; main()"]


@pytest.fixture(scope="module")
def localnet() -> Iterator[Localnet]:
    with Localnet() as net:
        yield net


def open_run(net: Localnet, owner_path: Path, run_id: str, permissionless: bool) -> None:
    """A run waiting for members; anyone may join it when `permissionless`."""
    if permissionless:
        assert run_cli(net, owner_path, "join-authorization-create", "--permissionless").exit_code == 0
    for argv in (["create-run", "-r", run_id, "-c", "v1"],
                 ["update-config", "-r", run_id, "--config-path", str(STATE)],
                 ["set-paused", "-r", run_id, "--resume"]):
        result = run_cli(net, owner_path, *argv)
        assert result.exit_code == 0, (argv, result.output)


@pytest.fixture(scope="module")
def runs(localnet: Localnet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Keypair]:
    """'open-run' (permissionless) and 'closed-run' (no authorization for anyone)."""
    tmp = tmp_path_factory.mktemp("runs")
    open_path, open_owner = funded_wallet(tmp, "open-owner", localnet)
    closed_path, closed_owner = funded_wallet(tmp, "closed-owner", localnet)
    open_run(localnet, open_path, "open-run", permissionless=True)
    open_run(localnet, closed_path, "closed-run", permissionless=False)
    return {"open": open_owner, "closed": closed_owner}


def test_list_runs_is_psyches_table_of_the_runs_this_wallet_can_join(
        localnet: Localnet, runs: dict[str, Keypair], tmp_path: Path) -> None:
    user_path = tmp_path / "user.json"
    user_path.write_text(Keypair().to_json())
    listed = run_cli(localnet, user_path, "list-runs")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert lines[0] == "Found 1 joinable run(s):"
    assert lines[1].split() == ["run-id", "state", "clients", "epoch", "time", "time", "left"]
    assert lines[1].index("state") < lines[1].index("clients") < lines[1].index("epoch time")
    [row] = lines[2:]
    assert row.split()[:2] == ["open-run", "WaitingForMembers"] and "waiting" in row
    assert row.index("WaitingForMembers") == lines[1].index("state")  # aligned columns

    every = run_cli(localnet, None, "list-runs", "--all").output
    assert "open-run " in every and "closed-run " in every

    theirs = run_cli(localnet, user_path, "list-runs", "--authorizer", str(runs["closed"].pubkey()))
    assert theirs.exit_code == 0 and theirs.output.startswith("No available runs to join")

    # --env-file: its RPC (and RPC_3) and wallet, as Psyche's list-runs reads them.
    env_file = tmp_path / "run.env"
    env_file.write_text(f"RPC=http://127.0.0.1:9\nRPC_3={localnet.url}\n"
                        f"WALLET_PRIVATE_KEY_PATH={user_path}\n")
    from_env = run_cli(localnet, None, "list-runs", "--env-file", str(env_file))
    assert from_env.exit_code == 0, from_env.output
    assert from_env.output.splitlines()[0] == "Found 1 joinable run(s):"

    no_wallet = run_cli(localnet, None, "list-runs")
    assert no_wallet.exit_code == 2 and "--all for every run" in no_wallet.output
    assert len(no_wallet.output.strip().splitlines()) == 1
    missing = run_cli(localnet, None, "list-runs", "--env-file", str(tmp_path / "none.env"))
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_can_join_and_json_dump_user_take_psyches_wallet_and_user(
        localnet: Localnet, runs: dict[str, Keypair], tmp_path: Path) -> None:
    user = Keypair()
    user_path = tmp_path / "user.json"
    user_path.write_text(user.to_json())
    for flag in ("--address", "--wallet", "--user"):
        allowed = run_cli(localnet, None, "can-join", "-r", "open-run", flag, str(user.pubkey()))
        assert allowed.exit_code == 0 and allowed.output.startswith("yes"), (flag, allowed.output)
        refused = run_cli(localnet, None, "can-join", "-r", "closed-run", flag, str(user.pubkey()))
        assert refused.exit_code == 1 and refused.output.startswith("no"), (flag, refused.output)
        dumped = run_cli(localnet, None, "json-dump-user", "-r", "open-run", flag, str(user.pubkey()))
        assert dumped.exit_code == 0, dumped.output
        assert json.loads(dumped.output)["address"] == str(user.pubkey())
    from_file = run_cli(localnet, None, "json-dump-user", "-r", "open-run", "--wallet", str(user_path))
    assert json.loads(from_file.output)["address"] == str(user.pubkey())
    bad = run_cli(localnet, None, "can-join", "-r", "open-run", "--user", "nobody")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert "neither a base-58 public key nor a keypair file: 'nobody'" in bad.output


def test_join_authorization_delegate_takes_delegate_added(localnet: Localnet, tmp_path: Path) -> None:
    owner_path, owner = funded_wallet(tmp_path, "authority", localnet)
    grantee_path, grantee = funded_wallet(tmp_path, "grantee", localnet)
    machine = Keypair().pubkey()
    created = run_cli(localnet, owner_path, "join-authorization-create", "--authorizer",
                      str(grantee.pubkey()))
    assert created.exit_code == 0, created.output
    added = run_cli(localnet, grantee_path, "join-authorization-delegate", "--join-authority",
                    str(owner.pubkey()), "--delegate-added", str(machine))
    assert added.exit_code == 0 and "1 delegate(s) added" in added.output, added.output
    read = run_cli(localnet, None, "join-authorization-read", "--join-authority",
                   str(owner.pubkey()), "--authorizer", str(grantee.pubkey()))
    assert json.loads(read.output)["delegates"] == [str(machine)]


def visible_commands() -> list[str]:
    """Every command path of the program (groups' commands as `wallet new`), not hidden."""
    found: list[str] = []

    def walk(command: object, prefix: str) -> None:
        group = command
        for name, child in getattr(group, "commands", {}).items():
            if child.hidden:
                continue
            found.append(f"{prefix}{name}")
            walk(child, f"{prefix}{name} ")

    walk(typer.main.get_command(app), "")
    return found


def test_print_all_help_markdown_lists_every_command() -> None:
    result = subprocess.run([*RUN_MANAGER, "print-all-help", "--markdown"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    document = result.stdout
    assert document.startswith("# Command-line help for `run-manager`\n")
    commands = visible_commands()
    assert {"list-runs", "can-join", "wallet new", "create-run"} <= set(commands)
    for command in commands:
        assert f"\n## `run-manager {command}`\n" in document, command
        assert f"* [`run-manager {command}`]" in document, command
    assert "Usage: run-manager list-runs [OPTIONS]" in document
    assert document.count("```") == 2 * (len(commands) + 1)  # one fenced help per command
    assert "## `run-manager print-all-help`" not in document  # hidden, as in Psyche
    refused = subprocess.run([*RUN_MANAGER, "print-all-help"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert refused.returncode == 2 and "needs --markdown" in refused.stderr
