"""W&B logging (`psyche-client train --wandb-project`), in wandb's offline mode: a real W&B
run written under a temporary WANDB_DIR, read back from its transaction log with wandb's
own record class. Without the flag nothing imports wandb; without the package, or a W&B
that refuses the run, `psyche-client train` says so in one line (exit 2)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from client_image.client_config import ClientConfig
from client_image.runtime.events import EvalScored, Trained
from client_image.telemetry.wandb_logging import INSTALL_HINT, start_wandb
from client_image.training.model import load_causal_lm
from tests.client_runtime.standin_client import StandInClient
from tests.telemetry.test_client_telemetry_set import Clock
from tests.telemetry.wandb_records import read_offline_run

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "assets" / "tiny-llama"  # vocab_size 4096: log2 = 12


def trained(step: int, loss: float, seconds: float, lr: float) -> Trained:
    return Trained(step=step, epoch=1, loss=loss, batch=(step, step), payload_bytes=1,
                   seconds=seconds, tokens=512, learning_rate=lr, grad_norm=0.5,
                   batch_tokens=1024)


def test_an_offline_run_holds_each_steps_metrics(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = ClientConfig.of(run_id="run-7", wandb_project="psyche-tests",
                             wandb_run="client-a", wandb_group="run-7", wandb_entity="ops")
    client = StandInClient(observe=False)
    client.worker = SimpleNamespace(model=load_causal_lm(TINY_MODEL, device="cpu"))  # type: ignore[attr-defined]  # the worker's one field read
    logger = start_wandb(config.observability, client, "ab" * 32, "run-7")  # type: ignore[arg-type]  # a stand-in client with only what W&B reads
    assert logger is not None
    logger.stats.clock = clock = Clock()
    client.events.emit(trained(3, 6.0, seconds=1.0, lr=1e-4))
    clock.now += 4.0
    client.events.emit(trained(4, 3.0, seconds=2.0, lr=2e-4))
    client.events.emit(EvalScored(task="HellaSwag", epoch=1, step=2, docs=10, acc=0.25,
                                  acc_norm=0.3, source="sample", seconds=1.0))
    logger.finish(timeout_s=60)

    offline = read_offline_run(tmp_path)
    run = offline.run
    assert (run.project, run.display_name, run.run_group, run.entity) == (
        "psyche-tests", "client-a", "run-7", "ops")
    rows = offline.by_step()
    assert set(rows) == {3, 4}, offline.history
    first, second = rows[3], rows[4]
    assert first["train/loss"] == 6.0 and first["train/lr"] == 1e-4
    assert first["train/confidence"] == pytest.approx(0.5)  # 1 - 6 / 12
    assert first["train/tokens_per_sec"] == 512.0
    assert first["train/perplexity"] == pytest.approx(math.exp(6.0))
    assert "train/efficency" not in first  # one step end: no interval yet
    assert second["train/loss"] == 3.0 and second["train/lr"] == 2e-4
    assert second["train/confidence"] == pytest.approx(0.75)
    assert second["train/tokens_per_sec"] == 256.0
    assert second["train/efficency"] == pytest.approx(0.5)  # 2 s of training in 4 s
    assert second["train/global_token_batch_size"] == 1024
    assert second["coordinator/epoch"] == 1 and second["optim/grad_norm"] == 0.5
    # the eval of an earlier checkpoint lands on the current step (W&B's steps only rise)
    assert second["eval/hellaswag"] == 0.3


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120, check=False)


def test_without_the_flag_nothing_imports_wandb() -> None:
    code = (
        "import sys\n"
        "from client_image.cli import app\n"
        "from client_image.client_config import ClientConfig\n"
        "from client_image.telemetry.wandb_logging import start_wandb\n"
        "from tests.client_runtime.standin_client import StandInClient\n"
        "client = StandInClient()\n"
        "assert start_wandb(ClientConfig.of(run_id='r').observability, client, 'n', 'r') is None\n"
        "client.events.emit(__import__('client_image.runtime.events', fromlist=['x']).Trained("
        "step=1, epoch=0, loss=1.0, batch=(0, 0), payload_bytes=0, seconds=1.0, tokens=1))\n"
        "print('wandb' in sys.modules, len(client.events.listeners))\n")
    done = run_python(code, {**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "1"]  # only the stand-in's own counters listen


def train_with_wandb(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client_image.cli", "train", "--run-id", "r",
         "--server-addr", "127.0.0.1:9", "--iroh-relay", "disabled", "--wandb-project", "p"],
        cwd=REPO, env={**os.environ, "RAW_IDENTITY_SECRET_KEY": "5a" * 32, **env}, text=True,
        capture_output=True, timeout=180, check=False, stdin=subprocess.DEVNULL)


def test_without_the_package_train_says_how_to_install_it(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # what Python does for a missing package: the import fails
    (blocker / "wandb.py").write_text("raise ImportError('No module named wandb')\n")
    done = train_with_wandb(tmp_path, {"PYTHONPATH": os.pathsep.join([str(blocker), str(REPO)])})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: --wandb-project needs the wandb package, which is not installed: "
        f"{INSTALL_HINT}"]


def test_online_without_an_api_key_is_one_line(tmp_path: Path) -> None:
    env = {"WANDB_MODE": "online", "WANDB_DIR": str(tmp_path), "HOME": str(tmp_path),
           "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    done = train_with_wandb(tmp_path, env)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: W&B run could not start: "), lines
    assert "API key" in lines[0]
