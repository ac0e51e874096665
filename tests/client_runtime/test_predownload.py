"""``psyche-client predownload``: the run read from a real coordinator on loopback (or a
state file), its model fetched (a local directory here: checked where it lies), its HTTP
token files reached on a real loopback HTTP server; a run it cannot serve is one line."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tcp_helpers import RUN_ID, make_state_file, server_options
from typer.testing import CliRunner

from client_image.cli import app
from client_image.predownload_cli import PredownloadError, run_config_from_coordinator
from coordinator import Coordinator
from coordinator_tcp.server import CoordinatorServer
from tests.data.range_http_server import serve_directory

ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN = 128  # config/local-testnet


def write_tokens(path: Path, samples: int) -> int:
    """A TwoBytes token file of `samples` samples plus the token HTTP reserves; its size."""
    tokens = np.arange(samples * SEQ_LEN + 1, dtype="<u2") % 4096
    path.write_bytes(tokens.tobytes())
    return path.stat().st_size


def http_location(*urls: str) -> dict[str, Any]:
    return {"Http": {"location": {"UrlList": list(urls)}, "token_size_in_bytes": "TwoBytes",
                     "shuffle": "DontShuffle"}}


@pytest.fixture
def token_server(tmp_path: Path) -> Any:
    data = tmp_path / "data"
    data.mkdir()
    sizes = {name: write_tokens(data / name, samples)
             for name, samples in (("a.ds", 3), ("b.ds", 2))}
    with serve_directory(data) as server:
        server.sizes = sizes  # type: ignore[attr-defined]  # what the tests compare with
        yield server


@pytest.fixture
async def coordinator(token_server: Any) -> AsyncIterator[CoordinatorServer]:
    state = make_state_file(model={"data_location": http_location(
        f"{token_server.url}/a.ds", f"{token_server.url}/b.ds")})
    server = CoordinatorServer(Coordinator.from_state_file(state), server_options())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def run_cli(*args: str) -> tuple[int, str, str]:
    """The real command in its own process (this test's loop runs the coordinator)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "client_image.cli", "predownload", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_predownload_reads_the_run_from_the_coordinator_and_reaches_its_files(
        coordinator: CoordinatorServer, token_server: Any) -> None:
    code, out, err = await run_cli("--server-addr", f"127.0.0.1:{coordinator.port}",
                                   "--run-id", RUN_ID)
    assert code == 0, err
    model = ROOT / "assets" / "tiny-llama"
    size = sum(p.stat().st_size for p in model.iterdir() if p.is_file())
    *files, sequences = out.splitlines()
    assert files == [
        f"model: Hub assets/tiny-llama -> assets/tiny-llama (5 files, {size} bytes)",
        f"data: Http {token_server.url}/a.ds ({token_server.sizes['a.ds']} bytes)",
        f"data: Http {token_server.url}/b.ds ({token_server.sizes['b.ds']} bytes)",
    ]
    # How many whole samples the files give is the sequence index's business.
    assert re.fullmatch(rf"data: Http: [1-9]\d* sequences of {SEQ_LEN} tokens reachable",
                        sequences), sequences
    assert [(method, path) for method, path, _ in token_server.requests] == [
        ("HEAD", "/a.ds"), ("HEAD", "/b.ds")]


async def test_an_unknown_run_or_an_unreachable_coordinator_is_one_line(
        coordinator: CoordinatorServer) -> None:
    with pytest.raises(PredownloadError, match="refused to show run 'no-such-run'"):
        await run_config_from_coordinator("127.0.0.1", coordinator.port, "no-such-run", 5)
    llm = await run_config_from_coordinator("127.0.0.1", coordinator.port, RUN_ID, 5)
    assert llm.architecture == "HfLlama"
    port = coordinator.port
    await coordinator.stop()
    code, out, err = await run_cli("--server-addr", f"127.0.0.1:{port}", "--run-id", RUN_ID)
    assert code == 1 and out == ""
    assert err.startswith(f"error: cannot reach the coordinator at 127.0.0.1:{port}: ")
    assert len(err.splitlines()) == 1


def write_state(path: Path, **model: Any) -> Path:
    path.write_text(make_state_file(model=model).to_toml())
    return path


def test_a_run_this_client_cannot_serve_is_one_error_line(tmp_path: Path,
                                                          token_server: Any) -> None:
    runner = CliRunner()
    mismatch = write_state(tmp_path / "deepseek.toml", architecture="HfDeepseek")
    result = runner.invoke(app, ["predownload", "--state", str(mismatch)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "error: the run says HfDeepseek, the checkpoint is llama (LlamaForCausalLM): "
        "HfDeepseek needs a deepseek_v3 checkpoint"]
    missing = write_state(tmp_path / "missing.toml",
                          data_location=http_location(f"{token_server.url}/a.ds",
                                                      f"{token_server.url}/gone.ds"))
    result = runner.invoke(app, ["predownload", "--state", str(missing)])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0].startswith("model: Hub assets/tiny-llama -> ")
    assert len(lines) == 2 and lines[1].startswith("error: data Http: ")
    assert "gone.ds" in lines[1]
    no_model = write_state(tmp_path / "no-model.toml",
                           checkpoint={"Hub": {"repo_id": "/nonexistent/psyche-model"}})
    result = runner.invoke(app, ["predownload", "--state", str(no_model)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "error: model Hub /nonexistent/psyche-model: model directory /nonexistent/psyche-model "
        "does not exist or is not a directory"]
    result = runner.invoke(app, ["predownload"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "error: give one of --state, --server-addr with --run-id (a TCP run) or --rpc "
        "with --run-id (a Solana run)"]


def test_local_and_dummy_runs_need_nothing_beforehand(tmp_path: Path) -> None:
    dummy = write_state(tmp_path / "dummy.toml", checkpoint={"Dummy": {"repo_id": ""}},
                        data_location="Dummy")
    result = CliRunner().invoke(app, ["predownload", "--state", str(dummy)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "model: Dummy (built-in): built at warm-up, nothing to fetch",
        "data: Dummy: read during the run, nothing to fetch"]
