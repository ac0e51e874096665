"""A client's ranks on two "hosts": rank 0 in the client process (TrainingWorker with
--local-ranks 1) and rank 1 in a `psyche-client sidecar` process, meeting at a loopback
rendezvous. It trains, applies, shares and checkpoints like a one-device client: the
same weights bit for bit, results within rounding of one device's."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from loopback import free_port
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.runtime.ports import Unrunnable
from client_image.runtime.worker import TrainingWorker
from client_image.training.distro import decompress
from client_image.training.parallel import ParallelDims
from client_image.training.rank_group import RankSetup
from client_image.training.wire import decode_result
from coordinator.config import state_file_from_dict
from psyche_common.token_files.local import LocalDataProvider

pytestmark = pytest.mark.slow

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
LLM = state_file_from_dict(tomllib.loads(LOCAL_TESTNET.read_text())).model


async def _train_three_steps(worker: TrainingWorker) -> list[bytes]:
    await worker.load_from_hub(str(TINY_MODEL), None, LLM, start_step=0)
    data = LocalDataProvider(TRAIN_DATA, 32)
    payloads = []
    for step in range(3):
        if step == 2:
            assert await worker.apply(step, [payloads[0]]) == 1
        out = await worker.train(step, data.get_samples(4 * step, 4 * step + 3),
                                 (4 * step, 4 * step + 3), cold_start=False)
        assert out.payload is not None
        payloads.append(out.payload)
    return payloads


async def test_a_sidecar_host_runs_the_second_rank(tmp_path):
    port = free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "client_image.cli", "sidecar", "--main-host", "127.0.0.1",
         "--world-size", "2", "--start-rank", "1", "--main-port", str(port)])
    split = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32",
                           ranks=RankSetup(ParallelDims(2, 1), main_port=port, local_ranks=1))
    try:
        split_payloads = await _train_three_steps(split)
        assert split.ranks is not None and split.ranks.followers == []  # rank 1 is remote
        split_weights, _, _ = split.sharing_payload()
        checkpoint = await split.save_checkpoint(tmp_path / "split", "run", 2, keep_steps=1)
    finally:
        split.close()
    assert sidecar.wait(timeout=60) == 0  # the leader's stop ends the sidecar cleanly

    single = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32")
    try:
        single_payloads = await _train_three_steps(single)
        single_weights, _, _ = single.sharing_payload()
        reference = await single.save_checkpoint(tmp_path / "single", "run", 2, keep_steps=1)
    finally:
        single.close()

    assert single.trainer is not None
    plans = single.trainer.plans
    for mine, theirs in zip(split_payloads, single_payloads, strict=True):
        ours = decompress([decode_result(mine, plans).tensors], plans, torch.float32, "cpu")
        ref = decompress([decode_result(theirs, plans).tensors], plans, torch.float32, "cpu")
        # 1-bit results: a sign may flip only where the delta is within rounding of zero
        flipped = sum(int((a != b).sum()) for a, b in zip(ours, ref, strict=True))
        assert flipped <= 1e-3 * sum(a.numel() for a in ours), flipped
    assert split_weights.keys() == single_weights.keys()
    for name, tensor in single_weights.items():
        assert torch.equal(split_weights[name], tensor), name
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == sorted(p.name for p in reference.iterdir())
    for name in files:
        if name.endswith(".safetensors"):
            assert (checkpoint / name).read_bytes() == (reference / name).read_bytes(), name


async def test_a_lost_rank_stops_the_client_instead_of_hanging_it():
    split = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32",
                           ranks=RankSetup(ParallelDims(2, 1)))
    try:
        await split.load_from_hub(str(TINY_MODEL), None, LLM, start_step=0)
        assert split.ranks is not None and len(split.ranks.followers) == 1
        split.ranks.followers[0].kill()
        split.ranks.followers[0].wait(timeout=10)
        batch = LocalDataProvider(TRAIN_DATA, 32).get_samples(0, 3)
        with pytest.raises(Unrunnable, match="rank process of this client exited"):
            await split.train(0, batch, (0, 3), cold_start=False)
    finally:
        split.close()
