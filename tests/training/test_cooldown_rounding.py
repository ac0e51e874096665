"""The cooldown's bf16 rounding across clients (TrainingWorker on the tiny model): the client
that keeps its model, one that loads it from that client's shared weights and one that
loads its checkpoint (from the Hub path, or as a restarted holder does) all hold
bit-identical weights, write bit-identical checkpoints and go
on training identically."""

import hashlib
import tomllib
from pathlib import Path

import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.runtime.worker import TrainingWorker
from client_image.training.checkpoint import read_checkpoint
from coordinator.config import state_file_from_dict
from psyche_common.token_files.local import LocalDataProvider

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
LLM = state_file_from_dict(tomllib.loads(LOCAL_TESTNET.read_text())).model
SEQ_LEN = 32


def _batch(start: int) -> torch.Tensor:
    return LocalDataProvider(TRAIN_DATA, SEQ_LEN).get_samples(start, start + 1)


def _weights(worker: TrainingWorker) -> dict[str, torch.Tensor]:
    assert worker.model is not None
    return worker.model.state_dict()


def _assert_same_weights(a: TrainingWorker, b: TrainingWorker) -> None:
    ours, theirs = _weights(a), _weights(b)
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert tensor.dtype == theirs[name].dtype == torch.float32, name
        assert torch.equal(tensor, theirs[name]), name


def _digest(checkpoint: Path) -> str:
    digest = hashlib.sha256()
    for file in [*sorted(checkpoint.glob("*.safetensors")), checkpoint / "config.json"]:
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


async def test_keepers_joiners_and_checkpoint_loaders_continue_bit_identically(tmp_path):
    keeper = TrainingWorker(device="cpu", micro_batch_size=2)
    await keeper.load_from_hub(str(TINY_MODEL), None, LLM, start_step=1)
    # An epoch of training: the weights leave bf16 values, the DisTrO buffer fills.
    first = await keeper.train(3, _batch(0), (0, 1), cold_start=False)
    await keeper.apply(5, [first.payload])
    assert any(not torch.equal(t, t.to(torch.bfloat16).float()) for t in _weights(keeper).values())

    # Cooldown (ModelKeeper.save_and_share): round, save, share.
    await keeper.round_to_bf16()
    checkpoint = await keeper.save_checkpoint(tmp_path / "keeper", "run", 5, 3)
    weights, config_json, tokenizer_json = await keeper.sharing_payload()
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}

    joiner = TrainingWorker(device="cpu", micro_batch_size=2)
    await joiner.load_from_peers(config_json, tokenizer_json, weights, LLM, start_step=6)
    loader = TrainingWorker(device="cpu", micro_batch_size=2)
    await loader.load_from_hub(str(checkpoint), None, LLM, start_step=6)
    # A holder that restarted and no peer could serve: it reads its own checkpoint of the
    # cooldown through the joiners' path (ModelKeeper.load), then serves it.
    restarted = TrainingWorker(device="cpu", micro_batch_size=2)
    await restarted.load_from_peers(*read_checkpoint(checkpoint), LLM, start_step=6)
    served = (await restarted.sharing_payload())[0]
    assert served.keys() == weights.keys()
    assert all(torch.equal(t, weights[n]) for n, t in served.items())
    workers = (keeper, joiner, loader, restarted)
    for other in workers[1:]:
        _assert_same_weights(keeper, other)

    # The next epoch: each trains step 6 (the keeper with its own DisTrO buffer), then all
    # apply the same results; and each checkpoints the result.
    outputs = [await worker.train(6, _batch(2 + 2 * i), (2 + 2 * i, 3 + 2 * i), cold_start=False)
               for i, worker in enumerate(workers)]
    for worker in workers:
        assert await worker.apply(8, [output.payload for output in outputs]) == len(workers)
    for other in workers[1:]:
        _assert_same_weights(keeper, other)
    for worker in workers:
        await worker.round_to_bf16()
    digests = {_digest(await worker.save_checkpoint(tmp_path / str(i), "run", 8, 3))
               for i, worker in enumerate(workers)}
    assert len(digests) == 1  # safetensors and config.json alike
    for worker in workers:
        worker.close()
