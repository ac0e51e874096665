"""A stop never leaves half a checkpoint (issue 16): a write interrupted midway leaves
nothing under the checkpoint's name, nor does a deletion of an old checkpoint interrupted
midway; a stopping client lets the write in progress finish (`TrainingWorker.wait_idle`)."""

from __future__ import annotations

import asyncio
import time
import tomllib
from pathlib import Path

import pytest
from training_assets import TINY_MODEL

from client_image.runtime.worker import TrainingWorker
from client_image.training import checkpoint as checkpoints
from client_image.training import load_causal_lm, save_checkpoint
from client_image.training.checkpoint import list_checkpoints
from coordinator.config import state_file_from_dict

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"


class Stopped(BaseException):
    """The process ending where it stands (what a second signal or a deadline does)."""


def complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def test_an_interrupted_write_leaves_no_checkpoint_under_its_name(tmp_path, monkeypatch):
    model = load_causal_lm(TINY_MODEL, device="cpu")
    save_checkpoint(model, tmp_path, "run", 1)

    def stop(_directory: Path) -> None:
        raise Stopped

    with monkeypatch.context() as patch:
        patch.setattr(checkpoints, "give_normal_file_modes", stop)
        with pytest.raises(Stopped):
            save_checkpoint(model, tmp_path, "run", 2)
        with pytest.raises(Stopped):  # a step written before: the old one stays whole
            save_checkpoint(model, tmp_path, "run", 1)
    assert [step for step, _ in list_checkpoints(tmp_path, "run")] == [1]
    assert complete(tmp_path / "run-step1")
    save_checkpoint(model, tmp_path, "run", 2)  # the next write of the step replaces it
    assert [step for step, _ in list_checkpoints(tmp_path, "run")] == [1, 2]
    # What is left of the abandoned writes is hidden, until that step is written again.
    assert [path.name for path in tmp_path.glob(".*")] == [".run-step1.partial"]


def test_an_interrupted_deletion_leaves_no_part_of_a_checkpoint(tmp_path, monkeypatch):
    model = load_causal_lm(TINY_MODEL, device="cpu")
    for step in (1, 2):
        save_checkpoint(model, tmp_path, "run", step, keep_steps=2)
    real_rmtree = checkpoints.shutil.rmtree

    def stop_midway(path: Path, *args: object, **kwargs: object) -> None:
        if Path(path).name.endswith(".deleting") and Path(path).is_dir():
            next(Path(path).glob("*.safetensors")).unlink()  # part of it is gone...
            raise Stopped  # ...and the process with it
        real_rmtree(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoints.shutil, "rmtree", stop_midway)
        with pytest.raises(Stopped):
            save_checkpoint(model, tmp_path, "run", 3, keep_steps=2)
    found = list_checkpoints(tmp_path, "run")
    assert [step for step, _ in found] == [2, 3]
    assert all(complete(path) for _, path in found)


async def test_a_stopping_client_lets_the_checkpoint_in_progress_finish(tmp_path,
                                                                       monkeypatch):
    llm = state_file_from_dict(tomllib.loads(LOCAL_TESTNET.read_text())).model
    worker = TrainingWorker(device="cpu", dtype="fp32")
    real_modes = checkpoints.give_normal_file_modes

    def slow_modes(directory: Path) -> None:  # a write that takes a while
        time.sleep(0.5)
        real_modes(directory)

    monkeypatch.setattr(checkpoints, "give_normal_file_modes", slow_modes)
    try:
        await worker.load_from_hub(str(TINY_MODEL), None, llm, start_step=0)
        saving = asyncio.ensure_future(worker.save_checkpoint(tmp_path, "run", 7, keep_steps=2))
        await asyncio.sleep(0.2)  # written in the worker thread now
        assert not saving.done()
        saving.cancel()  # the client stops: its round's tasks are cancelled
        with pytest.raises(asyncio.CancelledError):
            await saving
        assert await worker.wait_idle(60)
    finally:
        worker.close()
    [(step, path)] = list_checkpoints(tmp_path, "run")
    assert step == 7 and complete(path)
    assert not list(tmp_path.glob(".*"))
