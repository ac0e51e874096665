"""A short whole run of a Finetuning run on Preprocessed parquet: coordinator + 1 client,
no data server; every sample a prompt of real text (masked out of the loss, label -100)
and an answer of one repeated token, the only thing the loss sees."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e_helpers import log_tails
from loopback import free_port

from coordinator import load_state_file
from coordinator.config import PreprocessedDataLocation
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless
from psyche_common.token_files.local import LocalDataProvider

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ANSWER_TOKEN = 7


def write_finetuning_parquet(directory: Path, seq_len: int, rows: int) -> None:
    prompts = LocalDataProvider(ROOT / "assets" / "data" / "train", seq_len // 2)
    inputs, labels = [], []
    for row in range(rows):
        prompt = prompts.get_samples(row, row)[0].tolist()
        answer = [ANSWER_TOKEN] * (seq_len - len(prompt))
        inputs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"inputs": inputs, "labels": labels}),
                   directory / "train-00000.parquet", row_group_size=16)


async def test_one_client_finetunes_on_preprocessed_labels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config_dir = write_config_variant(tmp_path / "config", free_port(), total_steps=4,
                                      init_min_clients=1, epoch_time=25, warmup_time=20)
    state = load_state_file(config_dir / "state.toml")
    write_finetuning_parquet(tmp_path / "sft", state.model.max_seq_len, rows=64)
    state = state.model_copy(update={"model": state.model.model_copy(update={
        "data_type": "Finetuning",
        "data_location": PreprocessedDataLocation(source=str(tmp_path / "sft"))})})
    (config_dir / "state.toml").write_text(state.to_toml())
    (config_dir / "data.toml").unlink()  # no data server: the client reads the parquet
    testnet = Testnet(TestnetOptions(
        num_clients=1, config_path=config_dir, work_dir=tmp_path / "work",
        server_port=free_port(), metrics_base_port=free_port() - 2, timeout_s=240))
    summary = await run_headless(testnet)
    assert summary["error"] is None, f"{summary}\n{log_tails(testnet.options.work_dir)}"
    assert summary["finished"] and summary["final_step"] == 4
    # Only the repeated answer token is in the loss: it is quickly learnt.
    assert summary["last_loss"] < summary["first_loss"], summary
