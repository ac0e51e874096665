"""What DisTrO produced for a fixed seed, recorded so that a rewrite of the update can be
checked against the code that came before it (tests/training/test_distro_reference.py).

    .venv/bin/python tests/training/distro_reference.py           # rewrites the fixture
    .venv/bin/python tests/training/distro_reference.py --print   # prints it instead

records, for the bundled tiny model on CPU, SHA-256 hashes of every payload and of the
weights after each step, for:

- two DistroTrainer peers (the client's pipelined step: lookahead, error feedback, apply of
  step s-2's results), one applying decoded results (`apply`), the other the wire bytes
  (`apply_payloads`), with 1-bit signs, with bfloat16 values, and with token rows apart;
- the torch.optim DisTrO optimizer (synchronous step, LocalExchange), 1-bit and values.

The fixture was first written by the code before the DisTrO step was unified and grouped
(commit "tests: DisTrO payload and weight hashes recorded from the current code"), and
written again by that same code (a worktree of that commit) under the pinned CPU numerics
of reproducible_numerics.py, which every recording and check now runs under: the first
recording held only on CPUs like the one that made it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FIXTURE = HERE / "fixtures" / "distro_reference.json"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from reproducible_numerics import reproducible_numerics_active, run_reproducibly  # noqa: E402
from training_assets import TINY_MODEL, TRAIN_DATA  # noqa: E402

from client_image.training.distro_optimizer import DisTrO, LocalExchange  # noqa: E402
from client_image.training.model import load_causal_lm  # noqa: E402
from client_image.training.objective import causal_lm_loss  # noqa: E402
from client_image.training.trainer import DistroTrainer  # noqa: E402
from coordinator.config import ConstantLR, DistroOptimizer  # noqa: E402
from psyche_common.token_files.local import LocalDataProvider  # noqa: E402

STEPS = 4
SEQ_LEN = 32


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def weights_digest(params: Sequence[torch.Tensor]) -> str:
    hasher = hashlib.sha256()
    for param in params:
        hasher.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()[:16]


def config(one_bit: bool, token_rows: bool = False) -> DistroOptimizer:
    return DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                           quantize_1bit=one_bit, clip_grad_norm=1.0, weight_decay=0.1,
                           embeddings_per_token=token_rows)


def batches(peers: int) -> list[list[torch.Tensor]]:
    """batches[step][peer]: two sequences each."""
    data = LocalDataProvider(TRAIN_DATA, SEQ_LEN)
    return [[data.get_samples(2 * (step * peers + p), 2 * (step * peers + p) + 1)
             for p in range(peers)] for step in range(STEPS)]


def record_trainers(optimizer: DistroOptimizer) -> dict[str, list[str]]:
    """Two peers, STEPS steps, each applying both peers' results of step s-2 first."""
    torch.manual_seed(0)
    schedule = ConstantLR(base_lr=2e-3, warmup_init_lr=0.0, warmup_steps=1)
    trainers = [DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), optimizer, schedule,
                              micro_batch_size=1) for _ in range(2)]
    payloads: dict[int, list[bytes]] = {}
    out: dict[str, list[str]] = {"payloads": [], "weights": [], "weights_streamed": []}
    for step, step_batches in enumerate(batches(2)):
        if step - 2 in payloads:
            sent = payloads.pop(step - 2)
            trainers[0].apply(step, [trainers[0].decode(p) for p in sent])
            trainers[1].apply_payloads(step, sent)
        payloads[step] = []
        for p, (trainer, batch) in enumerate(zip(trainers, step_batches, strict=True)):
            result = trainer.train(step, batch, batch_id=(2 * p, 2 * p + 1))
            assert result.payload is not None
            payloads[step].append(result.payload)
            out["payloads"].append(digest(result.payload))
        out["weights"].append(weights_digest(trainers[0].params))
        out["weights_streamed"].append(weights_digest(trainers[1].params))
    return out


def record_optimizer(optimizer: DistroOptimizer) -> dict[str, list[str]]:
    """The torch.optim DisTrO alone (LocalExchange): its payload and weights per step."""
    torch.manual_seed(0)
    model = load_causal_lm(TINY_MODEL, device="cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    distro = DisTrO(params, optimizer, _RecordingExchange(), lr=2e-3)
    out: dict[str, list[str]] = {"payloads": [], "weights": []}
    for step_batches in batches(1):
        distro.zero_grad()
        causal_lm_loss(model, step_batches[0], 1, "fp32")
        distro.step()
        exchange = distro.exchange
        assert isinstance(exchange, _RecordingExchange)
        out["payloads"].append(digest(exchange.last))
        out["weights"].append(weights_digest(params))
    return out


class _RecordingExchange(LocalExchange):
    last = b""

    def exchange(self, step: int, payload: bytes) -> list[bytes]:
        self.last = payload
        return super().exchange(step, payload)


def record() -> dict[str, dict[str, list[str]]]:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return {
        "trainer_one_bit": record_trainers(config(one_bit=True)),
        "trainer_values": record_trainers(config(one_bit=False)),
        "trainer_token_rows": record_trainers(config(one_bit=True, token_rows=True)),
        "optimizer_one_bit": record_optimizer(config(one_bit=True)),
        "optimizer_values": record_optimizer(config(one_bit=False)),
    }


if __name__ == "__main__":
    if not reproducible_numerics_active():
        print(run_reproducibly(Path(__file__), *sys.argv[1:]), end="")
    elif "--print" in sys.argv[1:]:
        print(json.dumps(record(), indent=1))
    else:
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(record(), indent=1) + "\n")
        print(f"wrote {FIXTURE}")
