"""``psyche-client predownload --rpc URL --run-id RUN``: an on-chain run's model read from
its coordinator account on the local validator (LiteSVM behind JSON-RPC), downloaded from
a real Hub API server on loopback (tests/hub_emulator.py) into the HF cache the client's
warm-up reads, by the very command the run-manager's can-join prints; the second run
downloads nothing and says so; every failure is one line."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gcs_emulator import gcs_emulator
from hub_emulator import hub_emulator
from loopback import free_port
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from typer.testing import CliRunner

from client_image.cli import app
from client_image.training.gcs_checkpoint import upload_checkpoint_to_gcs
from coordinator import load_state_file
from coordinator.config import GcsCheckpoint, HubCheckpoint
from psyche_solana import instructions as ix
from psyche_solana.localnet import Localnet
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import admin, authorize, create_run, find_run, update_instructions
from run_manager.cli import app as run_manager

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "assets" / "tiny-llama"
REPO = "psyche-test/tiny-llama"
STATE = load_state_file(ROOT / "config" / "local-testnet" / "state.toml")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def net() -> Iterator[Localnet]:
    with Localnet() as localnet:
        yield localnet


def make_run(net: Localnet, run_id: str,
             checkpoint: HubCheckpoint | GcsCheckpoint | None) -> None:
    """A run on the validator; with a checkpoint, update-config has set it as the model."""
    async def create() -> None:
        async with SolanaRpc([net.url]) as rpc:
            owner = Keypair()
            await rpc.airdrop(owner.pubkey(), 20 * 10**9)
            await create_run(rpc, owner, run_id, "v1")
            if checkpoint is None:
                return
            run = await find_run(rpc, run_id)
            state = STATE.model_copy(update={
                "run_id": run_id,
                "model": STATE.model.model_copy(update={"checkpoint": checkpoint})})
            await admin(rpc, run, owner, [*update_instructions(run, owner.pubkey(), state, None),
                                          ix.set_paused(run.address, owner.pubkey(), False)])
            await authorize(rpc, owner, Pubkey.default())  # anyone may join

    asyncio.run(create())


def predownload(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real command in its own process: huggingface_hub reads HF_ENDPOINT and HF_HOME
    once, at import."""
    return subprocess.run([sys.executable, "-m", "client_image.cli", "predownload", *args],
                          cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=240, check=False)


def hf_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    return {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint,
            "HF_HUB_DISABLE_TELEMETRY": "1", "RPC": "", "RPC_2": "", "RUN_ID": ""}


def test_an_onchain_runs_hub_model_lands_in_the_client_cache_once(net: Localnet,
                                                                 tmp_path: Path) -> None:
    files = {path.name: path.read_bytes() for path in TINY.iterdir() if path.is_file()}
    size = sum(len(content) for content in files.values())
    with hub_emulator() as hub:
        commit = hub.commit(REPO, files)
        make_run(net, "predownload-hub", HubCheckpoint(repo_id=REPO))
        env = hf_env(tmp_path, hub.endpoint)
        joiner = str(Keypair().pubkey())
        can_join = CliRunner().invoke(run_manager, ["can-join", "-r", "predownload-hub",
                                                    "--address", joiner, "--rpc", net.url])
        assert can_join.exit_code == 0, can_join.output
        told = can_join.output.splitlines()[-1]
        assert told == ("fetch the model before joining: psyche-client predownload --rpc "
                        f"{net.url} --run-id predownload-hub --model")
        command = shlex.split(told.partition(": ")[2])
        assert command[:2] == ["psyche-client", "predownload"]
        first = predownload(env, *command[2:])
        assert first.returncode == 0, first.stderr
        snapshot = tmp_path / "hf" / "hub" / "models--psyche-test--tiny-llama" / "snapshots" / commit
        assert {path.name: path.read_bytes() for path in snapshot.iterdir()} == files
        assert first.stdout.splitlines() == [
            f"model: Hub {REPO} -> {snapshot} (5 files, {size} bytes): downloaded (5 files)"]
        fetched = [r for r in hub.requests if r.startswith(f"GET /{REPO}/resolve/")]
        assert len(fetched) == 5

        second = predownload(env, "--rpc", net.url, "--run-id", "predownload-hub", "--model")
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines() == [
            f"model: Hub {REPO} -> {snapshot} (5 files, {size} bytes): "
            "already in the cache, nothing downloaded"]
        assert [r for r in hub.requests if r.startswith(f"GET /{REPO}/resolve/")] == fetched

    # The warm-up's own lookup (resolve_model_dir, as load_from_hub calls it) finds the
    # snapshot with the Hub gone: nothing is left to download at the first warm-up.
    warm_up = subprocess.run(
        [sys.executable, "-c", "from client_image.training.model import resolve_model_dir; "
         f"print(resolve_model_dir({REPO!r}))"],
        cwd=ROOT, env={**os.environ, **hf_env(tmp_path, f"http://127.0.0.1:{free_port()}")},
        capture_output=True, text=True, timeout=120, check=False)
    assert warm_up.returncode == 0, warm_up.stderr
    assert warm_up.stdout.strip() == str(snapshot)


def test_an_onchain_runs_gcs_model_lands_in_the_gcs_cache_once(
        net: Localnet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "gcs-cache"
    with gcs_emulator(monkeypatch) as client:
        client.create_bucket("ckpts")
        upload_checkpoint_to_gcs(TINY, "ckpts", "run", run_id="init", epoch=0, step=3)
        make_run(net, "predownload-gcs", GcsCheckpoint(bucket="ckpts", prefix="run"))
        args = ["--rpc", net.url, "--run-id", "predownload-gcs", "--model",
                "--gcs-cache-dir", str(cache)]
        first = CliRunner().invoke(app, ["predownload", *args], env={"RPC": "", "RUN_ID": ""})
        assert first.exit_code == 0, first.output
        step = cache / "ckpts" / "run" / "step3"
        for path in TINY.iterdir():
            assert (step / path.name).read_bytes() == path.read_bytes()
        line = f"model: Gcs gs://ckpts/run -> {step} (6 files, "  # and Psyche's manifest.json
        assert first.output.startswith(line) and first.output.endswith(": downloaded (6 files)\n")
        second = CliRunner().invoke(app, ["predownload", *args], env={"RPC": "", "RUN_ID": ""})
        assert second.exit_code == 0, second.output
        assert second.output.startswith(line)
        assert second.output.endswith(": already in the cache, nothing downloaded\n")


def test_an_eval_tasks_data_set_missing_on_the_hub_is_one_line(net: Localnet,
                                                               tmp_path: Path) -> None:
    with hub_emulator() as hub:
        make_run(net, "predownload-evals", HubCheckpoint(repo_id="assets/tiny-llama"))
        result = predownload(hf_env(tmp_path, hub.endpoint), "--rpc", net.url, "--run-id",
                             "predownload-evals", "--eval-tasks", "arc_easy")
    assert result.returncode == 1 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: eval arc_easy: hub dataset allenai/ai2_arc: ")


def one_error_line(*args: str) -> str:
    result = CliRunner().invoke(app, ["predownload", *args],
                                env={"RPC": "", "RPC_2": "", "RUN_ID": "", "SERVER_ADDR": ""})
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_no_run_no_model_no_rpc_and_bad_flags_are_one_line_each(net: Localnet) -> None:
    assert one_error_line("--rpc", net.url, "--run-id", "no-such-run") == (
        f"error: no run 'no-such-run' on this cluster (see list-runs) (asked {net.url})")
    make_run(net, "predownload-empty", None)
    assert one_error_line("--rpc", net.url, "--run-id", "predownload-empty", "--model") == (
        "error: run 'predownload-empty' has no model yet: its owner has not set its config "
        "and model (run-manager update-config --config-path)")
    closed = f"http://127.0.0.1:{free_port()}"
    assert one_error_line("--rpc", closed, "--run-id", "r").startswith(
        f"error: cannot reach the Solana RPC at {closed}: ")
    assert one_error_line("--rpc", "ws://127.0.0.1:8900", "--run-id", "r") == (
        "error: --rpc must be an http:// or https:// URL, got 'ws://127.0.0.1:8900'")
    assert one_error_line("--rpc", net.url) == "error: --rpc needs --run-id"
    assert one_error_line("--rpc", net.url, "--server-addr", "127.0.0.1:1", "--run-id", "r") == (
        "error: give one of --state, --server-addr with --run-id (a TCP run) or --rpc with "
        "--run-id (a Solana run)")
    assert one_error_line("--rpc", net.url, "--run-id", "r", "--eval-tasks", "squad").startswith(
        "error: --eval-tasks: unknown eval task 'squad': use arc_challenge, ")
