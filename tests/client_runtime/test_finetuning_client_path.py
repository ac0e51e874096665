"""A Finetuning run's samples through the client's real path: the Preprocessed parquet
provider, `fetch_training_batch` (what the round runner and the verifier fetch), the
TrainingWorker's trainer, and a verifier's replay of that trainer with the same labels."""

import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from client_image.data import fetch_training_batch, open_provider
from client_image.formats.batch import IGNORE_INDEX, split_labels
from client_image.runtime.worker import TrainingWorker
from coordinator.config import LLMConfig, PreprocessedDataLocation, state_file_from_dict
from psyche_common.token_files.local import LocalDataProvider

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "assets" / "tiny-llama"
TRAIN_DATA = ROOT / "assets" / "data" / "train"
SEQ = 32
PROMPT = 10


def _llm(data_type: str) -> LLMConfig:
    state = state_file_from_dict(tomllib.loads(
        (ROOT / "config" / "local-testnet" / "state.toml").read_text()))
    return state.model.model_copy(update={"data_type": data_type})


def _tokens(count: int) -> torch.Tensor:
    return LocalDataProvider(TRAIN_DATA, SEQ).get_samples(0, count - 1)


def _write(directory: Path, name: str, inputs: torch.Tensor,
           labels: torch.Tensor | None) -> None:
    columns = {"inputs": inputs.tolist()}
    if labels is not None:
        columns["labels"] = labels.tolist()
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), directory / name, row_group_size=2)


def _prompt_masked(inputs: torch.Tensor) -> torch.Tensor:
    labels = inputs.clone()
    labels[:, :PROMPT] = IGNORE_INDEX
    return labels


@pytest.fixture
def finetuning_dir(tmp_path: Path) -> Path:
    """Rows 0-3 with prompt-masked labels, rows 4-5 in a file without a labels column."""
    tokens = _tokens(6)
    _write(tmp_path / "sft", "train-00000.parquet", tokens[:4], _prompt_masked(tokens[:4]))
    _write(tmp_path / "sft", "train-00001.parquet", tokens[4:], None)
    return tmp_path / "sft"


async def test_the_provider_gives_labels_to_finetuning_runs_only(finetuning_dir: Path) -> None:
    provider = await open_provider(PreprocessedDataLocation(source=str(finetuning_dir)), SEQ)
    tokens = _tokens(6)
    pretraining = await fetch_training_batch(provider, 0, 1, "Pretraining")
    assert torch.equal(pretraining, tokens[:2])  # the inputs exactly, as before
    inputs, labels = split_labels(await fetch_training_batch(provider, 2, 5, "Finetuning"))
    assert torch.equal(inputs, tokens[2:6])
    assert labels is not None
    assert torch.equal(labels[:2], _prompt_masked(tokens[2:4]))  # the file's labels
    assert torch.equal(labels[2:], tokens[4:6])  # no labels column: labels = inputs


async def test_a_finetuning_batch_trains_in_the_worker_and_its_replay_matches(
        finetuning_dir: Path) -> None:
    provider = await open_provider(PreprocessedDataLocation(source=str(finetuning_dir)), SEQ)
    llm = _llm("Finetuning")
    trainer, verifier, other = (TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32")
                                for _ in range(3))
    try:
        for worker in (trainer, verifier, other):
            await worker.load_from_hub(str(TINY_MODEL), None, llm, start_step=0)
        key = b"t" * 32
        step = 3  # past the warm-up: a learning rate above 0
        assert await verifier.follow([key], step)
        batch = await fetch_training_batch(provider, 0, 1, "Finetuning")
        assert batch.shape == (2, 2, SEQ)
        out = await trainer.train(step, batch, (0, 1), False)
        # The same inputs trained as Pretraining give another result and loss.
        unmasked = await other.train(step, batch[:, 0], (0, 1), False)
        assert out.payload is not None and out.payload != unmasked.payload
        assert out.loss != pytest.approx(unmasked.loss)
        # The verifier replays the trainer on the same labelled batch: the same bytes.
        await verifier.replay(key, step, batch, (0, 1), False)
        checked = await verifier.verify(key, step, out.payload)
        assert checked is not None and checked.verdict.ok, checked
        assert checked.published_hash == checked.expected_hash
    finally:
        for worker in (trainer, verifier, other):
            worker.close()
