"""A short whole run of a DeepSeek-V3-style MoE (`architecture = "HfDeepseek"`, Psyche's
consilience model family): coordinator + 2 clients on the bundled data, the tiny MoE of
tests/tiny_deepseek.py loaded from a local directory; both clients end bit-identical."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import checkpoint_digests, events, log_tails
from loopback import free_port
from tiny_deepseek import write_tiny_deepseek

from coordinator import load_state_file
from coordinator.config import HubCheckpoint
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow


@pytest.fixture
def deepseek_dir() -> Iterator[Path]:
    # A short path: a Hub repo_id is at most 64 bytes (pytest's tmp_path can be longer).
    directory = Path(tempfile.mkdtemp(prefix="psyche-ds-"))
    try:
        yield write_tiny_deepseek(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_two_clients_train_a_deepseek_moe_and_end_identical(
        tmp_path: Path, deepseek_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_dir = write_config_variant(tmp_path / "config", free_port(), total_steps=6,
                                      init_min_clients=2, epoch_time=25, warmup_time=20)
    state = load_state_file(config_dir / "state.toml")
    state = state.model_copy(update={"model": state.model.model_copy(update={
        "architecture": "HfDeepseek", "checkpoint": HubCheckpoint(repo_id=str(deepseek_dir))})})
    (config_dir / "state.toml").write_text(state.to_toml())
    testnet = Testnet(TestnetOptions(
        num_clients=2, config_path=config_dir, work_dir=tmp_path / "work",
        server_port=free_port(), metrics_base_port=free_port() - 3, timeout_s=300))
    summary = await run_headless(testnet)
    work = testnet.options.work_dir
    assert summary["error"] is None, f"{summary}\n{log_tails(work)}"
    assert summary["finished"] and summary["final_step"] == 6
    assert summary["last_loss"] < summary["first_loss"], summary
    digests = [checkpoint_digests(work, i) for i in (1, 2)]
    assert digests[0] and digests[0] == digests[1], digests
    for i in (1, 2):
        loaded = events(work, i, "model_loaded")
        assert loaded and loaded[0]["repo"] == str(deepseek_dir), loaded
        applied = events(work, i, "applied")
        assert applied and all(e["results"] >= 1 for e in applied), applied
        assert any(e["results"] == 2 for e in applied), applied  # both clients' results
