"""The client refuses what coordinator/capabilities.py says it cannot run, and opens what
it says it can: the table of docs/run-config.md ("What this client runs") is read off
the client's code, and these keep the two together."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_deepseek import write_tiny_deepseek

from client_image.data import (
    DummyDataProvider,
    LocalDataProvider,
)
from client_image.runtime.client import PsycheClient
from client_image.runtime.model_keeper import ModelKeeper
from client_image.runtime.ports import Unrunnable
from client_image.runtime.trainer_choice import TrainerSettings, local_trainer
from client_image.runtime.worker import TrainingWorker, WorkerError
from client_image.training.parallel import ParallelDims
from client_image.training.rank_group import RankSetup
from client_image.training.trainer import DistroTrainer
from coordinator.capabilities import unsupported_fields
from coordinator.config import state_file_from_dict

ROOT = Path(__file__).resolve().parents[2]
TESTNET = ROOT / "config" / "local-testnet" / "state.toml"


def llm_with(**model: Any) -> Any:
    data = tomllib.loads(TESTNET.read_text())
    data["model"]["LLM"].update(model)
    state = state_file_from_dict(data)
    return state, state.model


def fake_state(llm: Any) -> Any:
    return SimpleNamespace(model=llm, epoch_state=SimpleNamespace(start_step=0), run_id="r")


async def test_the_client_opens_a_dummy_data_location() -> None:
    state, llm = llm_with(data_location="Dummy")
    assert unsupported_fields(state) == []
    provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
    assert isinstance(provider, DummyDataProvider)
    assert (await provider.fetch(5, 6)).shape == (2, llm.max_seq_len)


async def test_the_client_opens_a_preprocessed_data_location(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    state, llm = llm_with(data_location={"Preprocessed": str(tmp_path)})
    assert unsupported_fields(state) == []
    rows = [[i] * llm.max_seq_len for i in range(3)]
    pq.write_table(pa.table({"inputs": rows}), tmp_path / "train-0.parquet")
    provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
    assert provider.num_sequences == 3
    assert (await provider.fetch(1, 2)).tolist() == rows[1:]


async def test_the_client_opens_a_weighted_http_data_location(tmp_path: Path) -> None:
    import json

    import numpy as np

    from tests.data.range_http_server import serve_directory

    seq = 4
    np.arange(3 * seq + 1, dtype="<u2").tofile(tmp_path / "a.ds")  # HTTP: 2 samples
    with serve_directory(tmp_path) as server:
        location = {"location": {"SingleUrl": f"{server.url}/a.ds"},
                    "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}
        (tmp_path / "mix.json").write_text(
            json.dumps({"shuffle": "DontShuffle", "providers": [[location, 1.0]]}))
        state, llm = llm_with(data_location={"WeightedHttp": f"{server.url}/mix.json"},
                              max_seq_len=seq)
        assert unsupported_fields(state) == []
        provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
        try:
            assert provider.num_sequences == 2
            assert (await provider.fetch(0, 1)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
        finally:
            await provider.aclose()


async def test_the_client_opens_a_local_data_location() -> None:
    state, llm = llm_with(data_location={"Local": str(ROOT / "assets" / "data" / "train")})
    assert unsupported_fields(state) == []
    provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
    assert isinstance(provider, LocalDataProvider) and provider.num_sequences > 0


async def test_the_client_opens_a_gcp_http_location(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    from gcs_emulator import gcs_emulator

    location = {"Http": {"location": {"Gcp": {"bucket_name": "b", "filter_directory": "t/"}},
                         "token_size_in_bytes": "TwoBytes", "shuffle": "DontShuffle"}}
    state, llm = llm_with(data_location=location, max_seq_len=4)
    assert unsupported_fields(state) == []
    with gcs_emulator(monkeypatch) as gcs:
        tokens = np.arange(3 * 4 + 2, dtype="<u2")  # HTTP: 2 samples (one token reserved)
        gcs.create_bucket("b").blob("t/0.ds").upload_from_string(tokens.tobytes())
        provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
        assert (await provider.fetch(0, 1)).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


class _Worker:
    def __init__(self) -> None:
        self.hub: list[str] = []

    async def load_from_hub(self, repo_id: str, revision: str | None, llm: Any,
                            start_step: int) -> None:
        self.hub.append(repo_id)


def keeper(worker: _Worker) -> ModelKeeper:
    return ModelKeeper(me=None, worker=worker, peers=None, backend=None,
                       events=SimpleNamespace(emit=lambda event: None),
                       options=None, spawn=None)


async def test_the_client_loads_a_hub_checkpoint() -> None:
    state, llm = llm_with(checkpoint={"Hub": {"repo_id": "org/init"}})
    assert unsupported_fields(state) == []
    worker = _Worker()
    await keeper(worker).load(fake_state(llm), [])
    assert worker.hub == ["org/init"]


async def test_the_client_loads_the_runs_architecture_and_refuses_another(
        tmp_path: Path) -> None:
    deepseek = str(write_tiny_deepseek(tmp_path / "deepseek"))
    state, llm = llm_with(architecture="HfDeepseek")
    assert unsupported_fields(state) == []
    worker = TrainingWorker(device="cpu")
    await worker.load_from_hub(deepseek, None, llm, 0)
    assert type(worker.model).__name__ == "DeepseekV3ForCausalLM"
    assert isinstance(worker.trainer, DistroTrainer)
    _, llama_run = llm_with(architecture="HfLlama")
    with pytest.raises(Unrunnable, match=r"^the run says HfLlama, the checkpoint is deepseek_v3 "
                                         r"\(DeepseekV3ForCausalLM\): HfLlama needs a llama "
                                         "checkpoint$"):
        await TrainingWorker(device="cpu").load_from_hub(deepseek, None, llama_run, 0)
    _, auto_run = llm_with(architecture="HfAuto")
    await TrainingWorker(device="cpu").load_from_hub(deepseek, None, auto_run, 0)
    # Tensor parallelism splits Llama blocks only: refused before any rank starts.
    split = TrainingWorker(device="cpu", ranks=RankSetup(dims=ParallelDims(dp=1, tp=2)))
    with pytest.raises(Unrunnable, match=r"^tensor parallelism \(T = 2\) splits Llama models "
                                         "only, the checkpoint is deepseek_v3"):
        await split.load_from_hub(deepseek, None, llm, 0)
    assert split.ranks is None


def test_the_client_trains_no_adamw_run() -> None:
    state, llm = llm_with(optimizer={"AdamW": {"betas": [0.9, 0.95], "weight_decay": 0.0,
                                               "eps": 1e-8}})
    assert unsupported_fields(state)
    with pytest.raises(WorkerError, match="Distro"):
        local_trainer(torch.nn.Linear(2, 2), llm, 0, TrainerSettings(1, "fp32"))


def test_the_client_refuses_sparseloco_on_a_model_split_across_ranks() -> None:
    state, llm = llm_with(optimizer={"SparseLoCo": {
        "inner_steps": 2, "inner_lr": 2e-3, "topk_density": 0.02, "chunk": 64,
        "quant_bits": 2, "error_decay": 0.95, "outer_lr": 1.0}})
    assert unsupported_fields(state) == []
    with pytest.raises(WorkerError, match="SparseLoCo optimizer does not run on a model split"):
        local_trainer(torch.nn.Linear(2, 2), llm, 0,
                      TrainerSettings(1, "fp32", split=True))


async def test_the_client_gives_a_finetuning_run_its_labels(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from client_image.data import fetch_training_batch

    state, llm = llm_with(data_type="Finetuning", data_location={"Preprocessed": str(tmp_path)})
    assert unsupported_fields(state) == []
    rows = [[i] * llm.max_seq_len for i in range(2)]
    labels = [[-100] * llm.max_seq_len, rows[1]]
    pq.write_table(pa.table({"inputs": rows, "labels": labels}), tmp_path / "train-0.parquet")
    provider = await PsycheClient._open_data(SimpleNamespace(), fake_state(llm))
    batch = await fetch_training_batch(provider, 0, 1, llm.data_type)
    assert batch[:, 0].tolist() == rows and batch[:, 1].tolist() == labels
