"""Replay verification across micro-batch sizes on one device: an honest bf16 trainer and a
verifier's shadow that replays it with another micro-batch size. Prints a line per step,
then ONE JSON line.

    python -m bench.gpu_replay [--model 125m|tiny|llama-1b] [--device cuda] [--steps 4]
        [--batch 8] [--micro-batch 4] [--replay-micro-batch 2] [--seq-len 512] [--one-bit]

Two copies of the same weights on the device: the trainer's (DistroTrainer, micro-batch
M) and the verifier's (client_image/verification/replay.py ReplayVerifier, micro-batch M',
both bf16 compute). Every step each trains the trainer's assigned batch (the bundled
data), the trainer's published result is compared with the shadow's with Psyche's three
distances (verification/similarity.py), and both copies apply the published result two
steps later, as clients do. Another micro-batch size changes the order in which bf16
gradients are summed: these distances are what an honest GPU client shows a verifier.
Values mode by default (as bench/verification.py): with --one-bit only signs travel.

JSON fields: gpu_replay_jaccard, gpu_replay_hamming, gpu_replay_manhattan (the largest over
the steps that had a result to compare), steps, micro_batch, replay_micro_batch, device_name.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import transformers

from bench.gpu_models import DATA, NAMES, model_dir
from client_image.formats.distro_wire import DistroResult
from client_image.training.model import load_causal_lm
from client_image.training.precision import configure_backends
from client_image.training.trainer import DistroTrainer
from client_image.verification import ReplayVerifier
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="125m", choices=NAMES)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--replay-micro-batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--one-bit", action="store_true")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    configure_backends(args.device)
    optimizer = DistroOptimizer(compression_decay=0.999, compression_topk=8,
                                compression_chunk=64, quantize_1bit=args.one_bit,
                                clip_grad_norm=1.0)
    schedule = ConstantLR(base_lr=4e-4, warmup_init_lr=0.0, warmup_steps=1)
    data = LocalDataProvider(DATA, args.seq_len)
    with tempfile.TemporaryDirectory() as scratch:
        source = model_dir(args.model, Path(scratch))
        trainer_model = load_causal_lm(source, device=args.device)
        verifier_model = load_causal_lm(source, device=args.device)
    trainer = DistroTrainer(trainer_model, optimizer, schedule,
                            micro_batch_size=args.micro_batch, compute="bf16")
    verifier = DistroTrainer(verifier_model, optimizer, schedule,
                             micro_batch_size=args.micro_batch, compute="bf16")
    shadow = ReplayVerifier(DistroTrainer(verifier_model, optimizer, schedule,
                                          micro_batch_size=args.replay_micro_batch,
                                          compute="bf16"))
    published: dict[int, DistroResult] = {}
    worst = {"jaccard": 0.0, "hamming": 0.0, "manhattan": 0.0}
    compared = 0
    for step in range(args.steps):
        if step - 2 in published:
            result = published.pop(step - 2)
            trainer.apply(step, [result])
            verifier.apply(step, [result])
        batch_id = (step * args.batch, (step + 1) * args.batch - 1)
        batch = data.get_samples(*batch_id)
        expected = shadow.expected(step, batch, batch_id)
        verifier.idle(step)  # the verifier's weights follow the trainer's (weight decay)
        out = trainer.train(step, batch, batch_id=batch_id)
        assert out.payload is not None
        published[step] = trainer.decode(out.payload)
        if trainer.learning_rate(step) == 0:  # nothing to compare: both results are empty
            continue
        distances = shadow.distances(published[step], expected)
        compared += 1
        for name, largest in worst.items():
            worst[name] = max(largest, getattr(distances, name))
        print(f"step {step}: loss {out.loss:.4f}, jaccard {distances.jaccard:.4f} hamming "
              f"{distances.hamming:.4f} manhattan {distances.manhattan:.4f}", flush=True)
    if not compared:
        raise SystemExit("no step had a result to compare: give --steps >= 2")
    name = (torch.cuda.get_device_name() if torch.device(args.device).type == "cuda"
            else "cpu")
    print(json.dumps({**{f"gpu_replay_{k}": round(v, 5) for k, v in worst.items()},
                      "steps": compared, "micro_batch": args.micro_batch,
                      "replay_micro_batch": args.replay_micro_batch, "device_name": name}))


if __name__ == "__main__":
    main()
