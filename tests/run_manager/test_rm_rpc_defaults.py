"""The run-manager's Solana endpoints as Psyche reads them: WS_RPC defaults from RPC
(ws:// or wss://, port + 1), and RPC_3 / WS_RPC_3 are a third fallback, used by the
run-manager itself and handed to the client container."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from solders.keypair import Keypair

from psyche_solana.localnet import Localnet
from run_manager.settings import SettingsError, env_file_warnings, load_settings, read_env_file

RUN_MANAGER = [sys.executable, "-c", "from run_manager.cli import main; main()"]


def wallet_file(tmp_path: Path) -> Path:
    path = tmp_path / "wallet.json"
    path.write_text(Keypair().to_json())
    return path


def env(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.env"
    path.write_text(f"WALLET_PRIVATE_KEY_PATH={wallet_file(tmp_path)}\n{text}")
    return path


def test_ws_rpc_defaults_from_rpc_and_reaches_the_container(tmp_path: Path) -> None:
    settings = load_settings(env(tmp_path, "RUN_ID=r\nRPC=http://127.0.0.1:8899\n"))
    assert settings.WS_RPC == "ws://127.0.0.1:8900"
    assert settings.container_environment()["WS_RPC"] == "ws://127.0.0.1:8900"
    secure = load_settings(env(tmp_path, "RUN_ID=r\nRPC=https://rpc.test:443\n"))
    assert secure.WS_RPC == "wss://rpc.test:444"
    given = load_settings(env(tmp_path, "RUN_ID=r\nRPC=http://127.0.0.1:8899\n"
                                        "WS_RPC=ws://127.0.0.1:9999\n"))
    assert given.WS_RPC == "ws://127.0.0.1:9999"  # a given one is kept


def test_rpc_3_is_a_third_endpoint_not_a_warning(tmp_path: Path) -> None:
    path = env(tmp_path, "RUN_ID=r\nRPC=http://127.0.0.1:1\nRPC_2=http://127.0.0.1:2\n"
                         "RPC_3=http://127.0.0.1:3\nWS_RPC_3=ws://127.0.0.1:4\n")
    settings = load_settings(path)
    assert settings.rpc_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    assert settings.ws_rpc_urls[2] == "ws://127.0.0.1:4"
    container = settings.container_environment()
    assert container["RPC_3"] == "http://127.0.0.1:3" and container["WS_RPC_3"] == "ws://127.0.0.1:4"
    assert not [w for w in env_file_warnings(read_env_file(path), settings) if "RPC_3" in w]
    with pytest.raises(SettingsError) as caught:
        load_settings(env(tmp_path, "RUN_ID=r\nRPC=http://127.0.0.1:1\nRPC_3=ftp://x\n"))
    [problem] = caught.value.problems
    assert problem.startswith("RPC_3: ") and "http:// or https://" in problem


@pytest.fixture(scope="module")
def localnet() -> Iterator[Localnet]:
    with Localnet() as net:
        yield net


@pytest.mark.timeout(120)
def test_the_run_manager_reaches_the_cluster_through_rpc_3(localnet: Localnet,
                                                          tmp_path: Path) -> None:
    """RPC and RPC_2 refuse connections; RPC_3 is the cluster: the run-manager lists the
    runs through it (none is open to this new wallet, so it stops there, exit 2)."""
    dead = "RPC=http://127.0.0.1:9\nRPC_2=http://127.0.0.1:10\n"
    with_third = env(tmp_path, f"{dead}RPC_3={localnet.url}\n")
    result = subprocess.run([*RUN_MANAGER, "--env-file", str(with_third), "--no-tui"],
                            capture_output=True, text=True, timeout=100, check=False)
    assert result.returncode == 2, result.stderr
    assert "RUN_ID is not set and no run" in result.stderr and "is open to wallet" in result.stderr
    assert "Traceback" not in result.stderr
    without = env(tmp_path, dead)
    result = subprocess.run([*RUN_MANAGER, "--env-file", str(without), "--no-tui"],
                            capture_output=True, text=True, timeout=100, check=False)
    assert result.returncode == 1, result.stderr
    assert "the runs could not be listed" in result.stderr
