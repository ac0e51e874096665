"""The client loads a Hub checkpoint only from a commit on its repository's main branch
(client_image/runtime/model_loading.py, refuse_off_main): what holds on Solana, where the
program cannot ask the Hub. A real client process loads from a Hub API server on
loopback (tests/hub_emulator.py), with HF_ENDPOINT set before huggingface_hub is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_emulator import HubEmulator, hub_emulator

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "assets" / "tiny-llama"
REPO = "assets/tiny-llama"

LOAD = """
import asyncio, sys
from tcp_helpers import make_state_file
from client_image.runtime.worker import TrainingWorker
from client_image.training.model import ModelLoadError

async def main() -> None:
    worker = TrainingWorker(device="cpu")
    try:
        await worker.load_from_hub(sys.argv[1], sys.argv[2], make_state_file().model, 0)
    except ModelLoadError as exc:
        print(f"refused: {exc}")
        return
    print(f"loaded: {sum(p.numel() for p in worker.model.parameters())} parameters")

asyncio.run(main())
"""


@pytest.fixture
def hub() -> Iterator[HubEmulator]:
    with hub_emulator(page_size=50) as emulator:
        emulator.commit(REPO, {path.name: path.read_bytes() for path in TINY.iterdir()
                               if path.is_file()}, title="initial")
        yield emulator


def load(hub: HubEmulator, revision: str, tmp_path: Path) -> str:
    return load_process(hub, revision, tmp_path).stdout.strip().splitlines()[-1]


def load_process(hub: HubEmulator, revision: str,
                 tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
           "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    # From tmp_path: the repo id must not name a local directory (assets/tiny-llama does
    # from the repository's root), or the client loads that instead of asking the Hub.
    done = subprocess.run([sys.executable, "-c", LOAD, REPO, revision], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_a_main_commit_is_loaded_and_a_pull_request_commit_refused(
        hub: HubEmulator, tmp_path: Path) -> None:
    main = hub.repos[REPO].refs["main"]
    pr = hub.commit(REPO, {"model.safetensors": b"not a model"}, ref="refs/pr/1")
    assert load(hub, main, tmp_path).startswith("loaded: ")
    assert any(r.startswith(f"GET /{REPO}/resolve/{main}/") for r in hub.requests)
    hub.requests.clear()
    line = load(hub, pr, tmp_path)
    assert line.startswith("refused: not loading the run's checkpoint: commit ")
    assert "not on its main branch" in line and "refs/pr/N" in line
    assert not [r for r in hub.requests if "/resolve/" in r]  # nothing of it downloaded


def test_an_unknown_commit_is_refused_and_an_unreachable_hub_leaves_it_to_the_cache(
        hub: HubEmulator, tmp_path: Path) -> None:
    line = load(hub, "d" * 40, tmp_path)
    assert line == (f"refused: not loading the run's checkpoint: Hub repository {REPO!r} at "
                    f"{hub.endpoint} has no commit {'d' * 40}")
    main = hub.repos[REPO].refs["main"]
    assert load(hub, main, tmp_path).startswith("loaded: ")  # now in the cache
    hub.stop()
    done = load_process(hub, main, tmp_path)
    assert done.stdout.strip().splitlines()[-1].startswith("loaded: ")  # from the cache
    assert "loading the run's checkpoint unchecked: cannot check commit" in done.stderr
