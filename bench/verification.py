"""Catching a dishonest client: detection rates of the cheap checks and replay verification
against seven attacks, false positives on honest clients, verifier cost, loss effect.
Prints its figures, then ONE JSON line.

    .venv/bin/python -m bench.verification [--steps 30] [--peers 4] [--one-bit]

A swarm in one process (the tiny model, CPU): `--peers` honest clients and one attacker,
each a DistroTrainer on its own copy of the model (the copies stay bit-identical: all
apply the same results). Client 0 is also the verifier: before its own training of a
step it replays every other client's assigned batch with a shadow trainer
(client_image/verification/replay.py) and runs the cheap checks
(verification/checks.py) on every result. A result that fails either is left out of
every client's apply. The attacks (one run each):

    random_signs   the honest result's indices with random signs (values: random sign)
    scaled         the honest result's values x 10
    stale          its previous step's result, re-sent as this step's
    copy           an honest peer's result of this step, re-signed as its own
    wrong_batch    trains honestly, but on other data than its assigned batch
    zeros          an empty result
    flipped_signs  the honest result with 10% of its signs flipped

Thresholds come from a calibration run of honest clients whose shadows differ from them
in the ways honest machines do: another CPU thread count, and bf16 instead of fp32
compute (Thresholds.from_honest: 3 x the largest honest distance, at least 0.02).

JSON fields: detect_rate_<attack> (flagged attacker results / attacker results),
false_positive_rate (flagged honest results / honest results verified, at least 200),
verify_cost_pct (shadow replay time / the trainer's own train time),
loss_with_attacker_vs_clean (the honest clients' final loss with the attacker present
and excluded when caught, over a run without it; the worst attack), thresholds.
Values mode by default (`quantize_1bit = false`): with 1-bit results a scaled result is
the honest one byte for byte (only signs travel), so it is harmless and undetectable.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import DistroResult, encode_result
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from client_image.verification import ReplayVerifier, Thresholds, cheap_checks
from client_image.verification.adversary import ATTACKS, attacked_tensors
from client_image.verification.similarity import Distances
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

REPO = Path(__file__).resolve().parents[1]

TINY = REPO / "assets" / "tiny-llama"
DATA = REPO / "assets" / "data" / "train"
SEQ_LEN, PER_PEER = 64, 2


@dataclass
class Tally:
    attacker: list[bool] = field(default_factory=list)
    honest: list[bool] = field(default_factory=list)
    honest_distances: list[Distances] = field(default_factory=list)
    final_loss: float = 0.0
    shadow_s: float = 0.0
    train_s: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)


def _optimizer(one_bit: bool) -> DistroOptimizer:
    return DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                           quantize_1bit=one_bit, clip_grad_norm=1.0, weight_decay=0.1)


SCHEDULE = ConstantLR(base_lr=2e-3, warmup_init_lr=0.0, warmup_steps=3)


def _encode(tensors: list[SparseResult], trainer: DistroTrainer, step: int,
            batch: tuple[int, int], one_bit: bool) -> bytes:
    return encode_result(tensors, trainer.plans, step=step, trainer_nonce=step,
                         batch_start=batch[0], batch_end=batch[1], one_bit=one_bit)


def run_swarm(attack: str | None, steps: int, peers: int, one_bit: bool,
              thresholds: Thresholds | None, shadow_variant: str = "same") -> Tally:
    """One swarm run; `attack` None: honest only (`peers` clients). Without thresholds it
    only measures honest distances (calibration). `shadow_variant`: same (fp32 both),
    threads (fp32, the shadow on another thread count), bf16 (bf16 trainers and shadows,
    other thread counts), bf16_vs_fp32 (bf16 trainers, fp32 shadows)."""
    torch.manual_seed(0)
    rng = torch.Generator().manual_seed(7)
    optimizer = _optimizer(one_bit)
    data = LocalDataProvider(DATA, SEQ_LEN)
    n = peers + (1 if attack else 0)
    models = [load_causal_lm(TINY, device="cpu") for _ in range(n)]
    trainer_compute = "bf16" if shadow_variant.startswith("bf16") else "fp32"
    trainers = [DistroTrainer(m, optimizer, SCHEDULE, micro_batch_size=PER_PEER,
                              compute=trainer_compute) for m in models]
    # Client 0 verifies everyone else (the attacker is the last client).
    compute = "bf16" if shadow_variant == "bf16" else "fp32"
    shadows = {c: ReplayVerifier(DistroTrainer(models[0], optimizer, SCHEDULE,
                                               micro_batch_size=PER_PEER, compute=compute))
               for c in range(1, n)}
    attacker = n - 1 if attack else None
    published: dict[int, dict[int, DistroResult]] = {}  # accepted results, by step
    sent: dict[int, dict[int, DistroResult]] = {}  # everything sent, by step
    honest_before: dict[int, DistroResult] = {}  # the attacker's last honest result
    tally = Tally()
    losses: list[float] = []
    for step in range(steps):
        accepted = [published[step - 2][c] for c in sorted(published.get(step - 2, {}))]
        if step >= 2:
            for trainer in trainers:
                trainer.apply(step, accepted)
        # Laid out for peers + 1 clients whether or not the attacker is there, so that the
        # honest clients train the same data in every run (the loss ratio compares runs).
        stride = (peers + 1) * PER_PEER
        batches = {c: (step * stride + c * PER_PEER, step * stride + (c + 1) * PER_PEER - 1)
                   for c in range(n)}
        expected = {}
        for c, shadow in shadows.items():
            threads = torch.get_num_threads()
            if shadow_variant in ("threads", "bf16"):
                torch.set_num_threads(1 if threads > 1 else 2)
            started = time.perf_counter()
            expected[c] = shadow.expected(step, data.get_samples(*batches[c]), batches[c])
            tally.shadow_s += time.perf_counter() - started
            torch.set_num_threads(threads)
        results: dict[int, DistroResult] = {}
        for c, trainer in enumerate(trainers):
            batch = batches[c]
            tokens = data.get_samples(*batch)
            if c == attacker and attack == "wrong_batch":
                tokens = data.get_samples(batch[0] + 5000, batch[1] + 5000)
            started = time.perf_counter()
            out = trainer.train(step, tokens, batch_id=batch)
            if c == 0:
                tally.train_s += time.perf_counter() - started
            assert out.payload is not None
            results[c] = trainer.decode(out.payload)
            if c != attacker:
                losses.append(out.loss)
        # wrong_batch at a learning rate of 0 sends the honest (empty) result
        attacked = attacker is not None and trainers[0].learning_rate(step) > 0
        if attacker is not None and attack != "wrong_batch":
            previous_sent = honest_before.pop(attacker, None)  # its own previous honest one
            honest_before[attacker] = results[attacker]
            honest_payload = _encode(list(results[attacker].tensors), trainers[attacker], step,
                                     batches[attacker], one_bit)
            tensors = attacked_tensors(attack, results[attacker], previous_sent, results[0], rng)
            payload = _encode(tensors, trainers[attacker], step, batches[attacker], one_bit)
            results[attacker] = trainers[attacker].decode(payload)
            # At a learning rate of 0 the honest result is empty: zeros, a scaled or
            # flipped empty result are the honest one, not an attack to catch.
            attacked = payload != honest_payload
        kept: dict[int, DistroResult] = {}
        for c, result in results.items():
            if c == 0:
                kept[c] = result
                continue
            distances = shadows[c].distances(result, expected[c])
            if thresholds is None:
                tally.honest_distances.append(distances)
                kept[c] = result
                continue
            others = {str(o): r for o, r in results.items() if o != c}
            previous = sent.get(step - 1, {}).get(c)
            failed = [check.name for check in cheap_checks(
                result, trainers[0].plans, others=others, previous=previous,
                learning_rate=trainers[0].learning_rate(step))]
            verdict = shadows[c].verify(result, expected[c], thresholds)
            if not verdict.ok:
                failed.append("replay")
            flagged = bool(failed)
            if c != attacker:
                tally.honest.append(flagged)
            elif attacked:
                tally.attacker.append(flagged)
            for name in failed:
                tally.reasons[name] = tally.reasons.get(name, 0) + 1
            if not flagged:
                kept[c] = result
        published[step] = kept
        sent[step] = results
    tally.final_loss = sum(losses[-5 * peers:]) / len(losses[-5 * peers:])
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--one-bit", action="store_true")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    random.seed(0)

    honest: list[Distances] = []
    for variant in ("same", "threads", "bf16", "bf16_vs_fp32"):
        calibration = run_swarm(None, args.steps, args.peers, args.one_bit, None, variant)
        seen = calibration.honest_distances
        print(f"honest distances, {variant}: max jaccard {max(d.jaccard for d in seen):.4f} "
              f"hamming {max(d.hamming for d in seen):.4f} manhattan "
              f"{max(d.manhattan for d in seen):.4f} ({len(seen)} results)")
        if variant != "bf16_vs_fp32":  # a verifier replays in the trainer's compute dtype
            honest += seen
    thresholds = Thresholds.from_honest(honest)
    print(f"thresholds: {thresholds}")

    clean = run_swarm(None, args.steps, args.peers, args.one_bit, thresholds)
    report: dict[str, object] = {}
    honest_flags: list[bool] = list(clean.honest)
    ratios = []
    cost = []
    for attack in ATTACKS:
        tally = run_swarm(attack, args.steps, args.peers, args.one_bit, thresholds)
        rate = sum(tally.attacker) / len(tally.attacker)
        honest_flags += tally.honest
        ratios.append(tally.final_loss / clean.final_loss)
        cost.append(100 * tally.shadow_s / len(tally.attacker + tally.honest) / (tally.train_s / args.steps))
        print(f"{attack:>14}: detected {rate:.1%} of {len(tally.attacker)}, reasons "
              f"{tally.reasons}, honest flagged {sum(tally.honest)}/{len(tally.honest)}, "
              f"loss ratio {ratios[-1]:.4f}")
        report[f"detect_rate_{attack}"] = round(rate, 4)
    false_positive_rate = sum(honest_flags) / len(honest_flags)
    print(f"false positives: {sum(honest_flags)} of {len(honest_flags)} honest results")
    print(json.dumps({
        **report,
        "false_positive_rate": round(false_positive_rate, 4),
        "honest_verifications": len(honest_flags),
        "verify_cost_pct": round(sum(cost) / len(cost), 1),
        "loss_with_attacker_vs_clean": round(max(ratios), 4),
        "thresholds": {"jaccard": round(thresholds.jaccard, 4),
                       "hamming": round(thresholds.hamming, 4),
                       "manhattan": round(thresholds.manhattan, 4)},
        "steps": args.steps, "peers": args.peers, "one_bit": args.one_bit,
    }))


if __name__ == "__main__":
    main()
