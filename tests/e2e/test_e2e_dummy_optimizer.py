"""Psyche's config/test as a whole local run: the coordinator and its 2 clients, the Dummy
checkpoint (the built-in seeded Llama), Dummy data and the Dummy optimizer. Each step
sleeps --dummy-training-delay-secs instead of training; results are shared, downloaded,
screened and applied as no update, checkpoints are written, and both clients end with
the Dummy model's own weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from e2e_helpers import checkpoint_digests, events, log_tails
from loopback import free_base_port, free_port
from safetensors.torch import load_file

from client_image.training.dummy_model import dummy_causal_lm
from coordinator import load_state_file
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow

PSYCHE_TEST = (Path(__file__).parents[1] / "coordinator" / "fixtures"
               / "psyche_config_test_state.toml")
DELAY_S = 0.5


def write_psyche_test(directory: Path) -> Path:
    """Psyche's config/test with a longer warm-up (two clients start torch on a shared
    machine) and epochs short enough for two, each ending in a cooldown's checkpoint."""
    state = load_state_file(PSYCHE_TEST)
    state = state.model_copy(update={"config": state.config.model_copy(update={
        "warmup_time": 10, "epoch_time": 14, "total_steps": 12})})
    directory.mkdir(parents=True)
    (directory / "state.toml").write_text(state.to_toml())
    return directory


async def test_psyches_config_test_runs_and_learns_nothing(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    testnet = Testnet(TestnetOptions(
        num_clients=2, config_path=write_psyche_test(tmp_path / "config"),
        work_dir=tmp_path / "work", server_port=free_port(), metrics_base_port=free_base_port(2),
        client_args=["--dummy-training-delay-secs", str(DELAY_S)], timeout_s=300))
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    assert summary["finished"] and summary["final_step"] == 12
    assert summary["last_loss"] == 0.0  # nothing is computed

    for i in (1, 2):
        trained = events(work, i, "trained")
        assert trained and all(e["payload_bytes"] == 30 and e["seconds"] >= DELAY_S
                               for e in trained), trained
        applied = events(work, i, "applied")
        assert applied and all(e["left_out"] == 0 for e in applied), applied
        assert sum(e["results"] for e in applied) >= len(applied)  # peers' results applied

    digests = [checkpoint_digests(work, i) for i in (1, 2)]
    assert len(digests[0]) == 2 and digests[0] == digests[1]  # both epochs' cooldowns
    assert len(set(digests[0].values())) == 1  # the second epoch changed nothing either
    # The weights never moved: the last checkpoint is the Dummy model (rounded to bf16).
    last = max((work / "client-1" / "checkpoints").glob("*-step*"),
               key=lambda path: int(path.name.rpartition("-step")[2]))
    saved: dict[str, torch.Tensor] = {}
    for file in last.glob("*.safetensors"):
        saved.update(load_file(file))
    built = dummy_causal_lm("").state_dict()
    assert saved and set(saved) <= set(built)
    assert all(torch.equal(saved[name].float(), built[name].bfloat16().float())
               for name in saved)
