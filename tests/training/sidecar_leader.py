"""The split client of test_sidecar_ranks.py, run as a process of its own:

    python tests/training/sidecar_leader.py PORT OUT_DIR

Rank 0 of a D = 2 client (TrainingWorker with --local-ranks 1) whose rank 1 is a
`psyche-client sidecar` at the same rendezvous PORT. It trains three steps (applying the
first step's result before the third), gathers the weights it would share with joiners
and writes a checkpoint, and leaves in OUT_DIR: payload0.bin.. (its results),
weights.pt (the shared weights) and checkpoint.txt (the checkpoint's folder).

Why a process and not the test's own: a gloo process group can end its process with a
C++ abort (pytorch/pytorch#65237, #50701), and inside pytest that would end the whole
run, with the abort's message lost in pytest's captured output."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path

import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.runtime.worker import TrainingWorker
from client_image.training.parallel import ParallelDims
from client_image.training.rank_group import RankSetup
from coordinator.config import state_file_from_dict
from psyche_common.token_files.local import LocalDataProvider

LOCAL_TESTNET = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
LLM = state_file_from_dict(tomllib.loads(LOCAL_TESTNET.read_text())).model


async def train_three_steps(worker: TrainingWorker) -> list[bytes]:
    """Load the tiny model, train steps 0-2 and apply step 0's result before step 2."""
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


async def run_leader(port: int, out: Path) -> None:
    split = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32",
                           ranks=RankSetup(ParallelDims(2, 1), main_port=port, local_ranks=1))
    try:
        payloads = await train_three_steps(split)
        assert split.ranks is not None and split.ranks.followers == []  # rank 1 is remote
        weights, _, _ = await split.sharing_payload()
        checkpoint = await split.save_checkpoint(out / "split", "run", 2, keep_steps=1)
    finally:
        split.close()
    for index, payload in enumerate(payloads):
        (out / f"payload{index}.bin").write_bytes(payload)
    torch.save(weights, out / "weights.pt")
    (out / "checkpoint.txt").write_text(str(checkpoint))


if __name__ == "__main__":
    asyncio.run(run_leader(int(sys.argv[1]), Path(sys.argv[2])))
