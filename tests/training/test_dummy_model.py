"""A Dummy checkpoint's model (client_image/training/dummy_model.py): built without any
download, bit-identical on every client, from repo_id's config.json or the built-in Llama."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from training_assets import TINY_MODEL

from client_image.runtime.model_keeper import ModelKeeper
from client_image.runtime.worker import TrainingWorker
from client_image.training.dummy_model import DUMMY_LLAMA, dummy_causal_lm, dummy_model_config
from coordinator.capabilities import unsupported_fields
from coordinator.config import load_state_file

ROOT = Path(__file__).resolve().parents[2]


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_builtin_model_is_bit_identical_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(1)
    before = torch.rand(3)
    torch.manual_seed(1)
    one = dummy_causal_lm("")
    torch.rand(5)  # other draws in between change nothing
    other = dummy_causal_lm("")
    assert _same(one, other)
    assert dummy_model_config("").hidden_size == DUMMY_LLAMA["hidden_size"]
    assert any(p.abs().sum() > 0 for p in one.parameters())  # initialised, not zeros
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), before)


def test_a_local_directory_gives_its_architecture_not_its_weights() -> None:
    model = dummy_causal_lm(str(TINY_MODEL))
    reference = dummy_causal_lm(str(TINY_MODEL))
    assert _same(model, reference)
    assert dummy_model_config(str(TINY_MODEL)).hidden_size != DUMMY_LLAMA["hidden_size"]


async def test_the_client_loads_a_dummy_checkpoint_in_its_worker() -> None:
    state = load_state_file(ROOT / "config" / "local-testnet" / "state.toml")
    from coordinator.config import DummyCheckpoint

    llm = state.model.model_copy(update={"checkpoint": DummyCheckpoint(repo_id="")})
    assert unsupported_fields(state.model_copy(update={"model": llm})) == []
    workers = [TrainingWorker(device="cpu", micro_batch_size=1, dtype="fp32") for _ in range(2)]
    events: list[object] = []
    try:
        for worker in workers:
            nothing: Any = None  # the parts a load does not reach
            recorder: Any = SimpleNamespace(emit=events.append)
            keeper = ModelKeeper(me=nothing, worker=worker, peers=nothing, backend=nothing,
                                 events=recorder, options=nothing, spawn=nothing)
            state_now: Any = SimpleNamespace(model=llm, epoch_state=SimpleNamespace(
                start_step=0))
            await keeper.load(state_now, [])
        assert workers[0].model is not None and workers[1].model is not None
        assert _same(workers[0].model, workers[1].model)
        assert [getattr(e, "source", None) for e in events] == ["dummy", "dummy"]
    finally:
        for worker in workers:
            worker.close()


def test_an_unreadable_config_is_a_one_line_error(tmp_path: Path) -> None:
    from client_image.training.dummy_model import DummyModelError

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DummyModelError, match=r"Dummy checkpoint .*: config.json unreadable"):
        dummy_causal_lm(str(tmp_path))
