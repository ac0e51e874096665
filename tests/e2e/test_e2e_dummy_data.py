"""A short whole run on Psyche's `Dummy` data location: coordinator + 1 client, no data
server, every sample max_seq_len zeros (client_image/data/dummy.py)."""

from __future__ import annotations

import pytest
from e2e_helpers import log_tails
from loopback import free_base_port, free_port

from coordinator import load_state_file
from coordinator.config import DummyDataLocation
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless

pytestmark = pytest.mark.slow


async def test_one_client_trains_on_dummy_data(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_dir = write_config_variant(tmp_path / "config", free_port(), total_steps=4,
                                      init_min_clients=1, epoch_time=25, warmup_time=20)
    state = load_state_file(config_dir / "state.toml")
    state = state.model_copy(update={"model": state.model.model_copy(
        update={"data_location": DummyDataLocation()})})
    (config_dir / "state.toml").write_text(state.to_toml())
    (config_dir / "data.toml").unlink()  # no data server: the client makes its own data
    testnet = Testnet(TestnetOptions(
        num_clients=1, config_path=config_dir, work_dir=tmp_path / "work",
        server_port=free_port(), metrics_base_port=free_base_port(1), timeout_s=240))
    summary = await run_headless(testnet)
    assert summary["error"] is None, f"{summary}\n{log_tails(testnet.options.work_dir)}"
    assert summary["finished"] and summary["final_step"] == 4
    # All-zero tokens are quickly learnt: the loss falls.
    assert summary["last_loss"] < summary["first_loss"], summary
