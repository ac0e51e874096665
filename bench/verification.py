"""Verification under honest noise: how far an honest replay on another machine lands
from the trainer's result, the thresholds that follow, which attacks those thresholds
catch and from what strength, and the loss an attacker costs before it is ejected.
Prints its figures, then ONE JSON line.

    .venv/bin/python -m bench.verification [--steps 18] [--peers 3] [--seeds 3] [--smoke]
        [--first-seed 0] [--dtypes fp32,bf16] [--skip-loss]

Honest noise (bench/verification_noise.py): swarms of honest clients (the tiny model,
CPU, 1 thread, micro-batch = batch, math SDPA), each client's batch replayed at every step
by shadows on other setups: `threads` (2 threads), `microbatch` (micro-batches of 1),
`sdpa_kernel` (flash instead of math SDPA; bf16 only; CPU torch has no `efficient`
kernel, which is CUDA-only), `mixed` (all three), in fp32 and in bf16 swarms, 1-bit and
values mode, each seed on other data; `dtype_mismatch` (an fp32 replay of a bf16
trainer) is measured, but is no honest noise a verifier may accept (it replays in the
trainer's declared dtype). Thresholds: Thresholds.from_honest over every honest
verification (`--margin` x the largest distance, at least 0.02).

Declared settings (formats/replay_settings.py): the `declared` shadow replays in exactly
the trainer's setup, as a follower does when the trainer declares it in its results;
`other_cpu` replays in it with oneDNN off (a CPU without oneDNN's bf16 kernels, which
cannot reproduce such a declaration). The declared thresholds come from the `declared`
replays alone, and every attack is judged a second time against the `declared` shadow
with them (verification/followers.py DECLARED_THRESHOLDS is what the client uses).

Attacks (bench/verification_attacks.py) are judged against the `mixed` shadow with the
client's thresholds (verification/followers.py DEFAULT_THRESHOLDS) plus the cheap checks
of a client's screen; the loss runs (bench/verification_delay.py) apply them until the
protocol ejects the attacker.

JSON fields: false_positive_rate (honest results flagged by replay or the screen, over all
honest noise sources), honest_verifications, honest_p99_{jaccard,hamming,manhattan},
detect_rate_<attack>[_<strength>] (flagged / forged results; scale: values mode only,
1-bit sends the honest bytes), min_detected_sign_flip_pct, min_detected_scale,
min_detected_lazy_pct (the least share of its batch, in %, a lazy trainer may skip and
still be detected: 10 = lazy_90), with detection >= 0.95 (null: none),
copy_originals_left_out, loss_with_attacker_vs_clean (the worst attack; null with
--skip-loss), thresholds; for a replay in the declared settings:
false_positive_rate_declared, honest_declared_verifications, detect_rate_declared_<attack>,
gross_min_detect_rate_declared, min_detected_{sign_flip_pct,scale,lazy_pct}_declared,
thresholds_declared; false_positive_rate_client: every honest replay judged as the client
judges it, with the limits it ships (a replay in the declared settings with
DECLARED_THRESHOLDS, any other with THRESHOLDS), plus the screen: with `--first-seed 3`
(seeds those limits were not derived from), a held-out false-positive rate.
"""

from __future__ import annotations

import os

# Passive OpenMP waits: a 2-thread replay on a shared machine otherwise spins for seconds.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import time
from collections.abc import Callable, Sequence

import torch
import transformers

from bench.verification_attacks import (
    GROSS,
    LAZY,
    LAZY_PCTS,
    SCALES,
    SIGN_FLIP_PCTS,
)
from bench.verification_delay import DECLARED_FOLLOWERS, FOLLOWER_SOURCES, delay_run
from bench.verification_noise import Judged, follow_run
from client_image.training.precision import ComputeDType
from client_image.verification import Thresholds
from client_image.verification.followers import DECLARED_THRESHOLDS as CLIENT_DECLARED
from client_image.verification.followers import THRESHOLDS as CLIENT_THRESHOLDS
from client_image.verification.replay import judge
from client_image.verification.similarity import Distances

METRICS = ("jaccard", "hamming", "manhattan")
EXCLUDED = "dtype_mismatch"
DECLARED = "declared"  # the replay in the trainer's declared settings
# (attack, 1-bit): the shipped configs are 1-bit; scale only changes values-mode bytes
LOSS_ATTACKS = (*((a, True) for a in ("random_signs", "zeros", "stale", "partial_copy",
                                     "wrong_batch", "copy_pos0", "sign_flip_1", "lazy_90")),
                ("scale_1.05", False))
# Threshold floors: room for rounding on machines not measured here. Hamming's is lower:
# an honest replay's shared slots never disagreed in sign (a top-k coefficient's sign
# moves only if the noise exceeds the coefficient), and 1 % of flipped signs is 0.01.
FLOORS = {"jaccard": 0.02, "hamming": 0.002, "manhattan": 0.02}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def spread(distances: list[Distances]) -> str:
    parts = []
    for metric in METRICS:
        values = [getattr(d, metric) for d in distances]
        parts.append(f"{metric} p50 {quantile(values, 0.5):.4f} p99 {quantile(values, 0.99):.4f}"
                     f" max {max(values, default=0.0):.4f}")
    return " | ".join(parts)


def low_tail(distances: list[Distances]) -> str:
    """An attack's smallest distances: what has to clear the thresholds."""
    parts = []
    for metric in METRICS:
        values = [getattr(d, metric) for d in distances]
        parts.append(f"{metric} min {min(values, default=0.0):.4f} p1 {quantile(values, 0.01):.4f}"
                     f" p50 {quantile(values, 0.5):.4f}")
    return " | ".join(parts)


def flagged(j: Judged, thresholds: Thresholds) -> bool:
    return j.cheap is not None or not judge(j.distances, thresholds).ok


def flagged_declared(j: Judged, thresholds: Thresholds) -> bool:
    """By the screen, or by a follower replaying in the trainer's declared settings."""
    assert j.declared is not None
    return j.cheap is not None or not judge(j.declared, thresholds).ok


def detection(attacks: dict[tuple[str, str, str], list[Judged]],
              caught: Callable[[Judged, str], bool],
              distances: Callable[[Judged], Distances | None]) -> dict[str, float]:
    """Per attack, the share of its forged results `caught` flags (given the swarm's compute
    dtype), printed with each (dtype, mode) cell's count and the low tail of `distances`."""
    rates = {}
    for name in sorted({n for n, _, _ in attacks}):
        pooled = [(j, c) for (n, c, _), js in attacks.items() if n == name for j in js]
        rates[name] = sum(caught(j, c) for j, c in pooled) / len(pooled)
        cheap = sum(j.cheap is not None for j, _ in pooled)
        print(f"  {name:>16}: detected {rates[name]:.1%} of {len(pooled)} (screen {cheap})")
        for (n, c, m), js in sorted(attacks.items()):
            if n == name:
                tail = low_tail([d for j in js if (d := distances(j)) is not None])
                print(f"  {'':>16}  {c} {m:>6}: {sum(caught(j, c) for j in js)}/{len(js)}"
                      f"  {tail}")
    return rates


def derive(honest: list[Distances], margin: float) -> Thresholds:
    """margin x the largest honest distance, never under FLOORS."""
    return Thresholds(**{m: max(FLOORS[m], margin * max((getattr(d, m) for d in honest),
                                                        default=0.0)) for m in METRICS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="steps of each honest swarm")
    parser.add_argument("--peers", type=int, default=3, help="honest clients of a swarm")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the swarms' seeds are first-seed .. first-seed + seeds - 1: "
                             "seeds the client's limits were not derived from (>= 3) make "
                             "false_positive_rate_client a held-out measurement")
    parser.add_argument("--delay-steps", type=int, default=12, help="steps of each loss run")
    parser.add_argument("--delay-peers", type=int, default=2,
                        help="honest clients of each loss run (and the attacker)")
    parser.add_argument("--report-rounds", type=int, default=2,
                        help="rounds from the verdict to the ejection (1: the next round)")
    parser.add_argument("--margin", type=float, default=3.0)
    parser.add_argument("--smoke", action="store_true",
                        help="seconds: 1 seed, 1-bit, bf16, few steps, one lazy trainer")
    parser.add_argument("--dtypes", default="fp32,bf16",
                        help="the swarms' compute dtypes, comma-separated (fp32, bf16)")
    parser.add_argument("--skip-loss", action="store_true",
                        help="no loss runs (bench/verification_delay.py): the detection only")
    parser.add_argument("--loss-followers", choices=("undeclared", "declared"),
                        default="declared",
                        help="the loss runs' two followers: both in the trainer's declared "
                             "settings with the declared limits (the default: followers of "
                             "its replay class, as the follow plan elects them), or on the "
                             "`mixed` and `microbatch` setups with the loose limits")
    args = parser.parse_args()
    modes: tuple[bool, ...] = (True, False)
    chosen = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    if not chosen or any(d not in ("fp32", "bf16") for d in chosen):
        parser.error(f"--dtypes {args.dtypes!r}: fp32, bf16 or both, comma-separated")
    computes: tuple[ComputeDType, ...] = tuple(
        d for d in ("fp32", "bf16") if d in chosen)  # type: ignore[misc]  # mypy cannot narrow str to the Literal
    lazy_kinds, loss_attacks = LAZY, LOSS_ATTACKS
    if args.smoke:
        args.steps, args.peers, args.seeds, args.delay_steps, args.delay_peers = 4, 2, 1, 6, 2
        modes, computes, lazy_kinds = (True,), ("bf16",), ("lazy_90",)
        loss_attacks = (("random_signs", True),)
    if (args.steps < 3 or args.peers < 2 or args.seeds < 1 or args.delay_steps < 6
            or args.delay_peers < 2 or args.first_seed < 0):
        parser.error("needs --steps >= 3, --peers >= 2, --seeds >= 1, --delay-steps >= 6, "
                     "--delay-peers >= 2, --first-seed >= 0")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    started = time.perf_counter()

    honest: dict[tuple[str, str, str], list[Distances]] = {}  # (source, compute, mode)
    attacks: dict[tuple[str, str, str], list[Judged]] = {}  # (attack, compute, mode)
    honest_screened = honest_results = victims = victims_out = 0
    for one_bit in modes:
        mode = "1bit" if one_bit else "values"
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for compute in computes:
                # Lazy trainers in bf16 swarms only, where honest noise is largest (time).
                run = follow_run(one_bit, seed, compute, args.steps, args.peers,
                                 lazy_kinds if compute == "bf16" else ())
                for source, seen in run.honest.items():
                    honest.setdefault((source, compute, mode), []).extend(seen)
                for name, judged in run.attacks.items():
                    attacks.setdefault((name, compute, mode), []).extend(judged)
                honest_screened += run.honest_left_out
                honest_results += run.honest_results
                victims += run.copy_victims
                victims_out += run.copy_victims_left_out
            print(f"[{time.perf_counter() - started:.0f} s] {mode} seed {seed} done", flush=True)

    print("honest replay distances, by source (trainer: 1 thread, micro-batch 2, math SDPA):")
    for (source, dtype, mode), seen in sorted(honest.items()):
        print(f"  {source:>14} {dtype} {mode:>6} n={len(seen):4d}  {spread(seen)}")
    measured: dict[str, Thresholds] = {}
    for compute in computes:
        seen = [d for (source, c, _), ds in honest.items() if c == compute and source != EXCLUDED
                for d in ds]
        print(f"  {'all honest':>14} {compute}   both n={len(seen):4d}  {spread(seen)}")
        measured[compute] = derive(seen, args.margin)
    print(f"thresholds from honest noise ({args.margin:g} x the largest distance, floors "
          f"{FLOORS}, {EXCLUDED} left out):")
    for dtype, limits in measured.items():
        client = CLIENT_THRESHOLDS[dtype]
        print(f"  {dtype}: measured {limits}; the client's (verification/followers.py "
              f"THRESHOLDS) {client}, {'the same' if client == limits else 'DIFFERENT'}")

    declared_limits: dict[str, Thresholds] = {}
    print(f"declared settings: replays in the trainer's declared settings ({DECLARED}) vs "
          "every other honest source; thresholds from the declared replays alone:")
    for compute in computes:
        exact = [d for (source, c, _), ds in honest.items() if c == compute and source == DECLARED
                 for d in ds]
        other = [d for (source, c, _), ds in honest.items()
                 if c == compute and source not in (DECLARED, EXCLUDED) for d in ds]
        declared_limits[compute] = derive(exact, args.margin)
        print(f"  {DECLARED:>14} {compute}   both n={len(exact):4d}  {spread(exact)}")
        print(f"  {'undeclared':>14} {compute}   both n={len(other):4d}  {spread(other)}")
        client = CLIENT_DECLARED[compute]
        print(f"  {compute}: measured {declared_limits[compute]}; the client's "
              f"(verification/followers.py DECLARED_THRESHOLDS) {client}, "
              f"{'the same' if client == declared_limits[compute] else 'DIFFERENT'}")
    declared_counted = [(d, c) for (source, c, _), ds in honest.items() if source == DECLARED
                        for d in ds]
    declared_flags = sum(not judge(d, declared_limits[c]).ok for d, c in declared_counted)
    print(f"honest verifications in declared settings: {len(declared_counted)} replays, "
          f"{declared_flags} over the declared thresholds; screen: {honest_screened} of "
          f"{honest_results} honest results left out")
    false_positive_rate_declared = ((declared_flags + honest_screened)
                                    / max(1, len(declared_counted) + honest_results))

    counted = [(d, c) for (source, c, _), ds in honest.items() if source != EXCLUDED
               for d in ds]
    honest_flags = sum(not judge(d, measured[c]).ok for d, c in counted)
    mismatch = [d for (source, _, _), ds in honest.items() if source == EXCLUDED for d in ds]
    print(f"honest verifications: {len(counted)} replays, {honest_flags} over the thresholds; "
          f"screen: {honest_screened} of {honest_results} honest results left out; "
          f"{EXCLUDED} (bf16 trainer, fp32 replay): {len(mismatch)} replays, "
          f"{sum(not judge(d, measured['bf16']).ok for d in mismatch) if 'bf16' in measured else 0}"
          f" over the bf16 thresholds (a dtype the verifier must not replay in)")
    false_positive_rate = ((honest_flags + honest_screened)
                           / max(1, len(counted) + honest_results))
    # As the client judges: a replay in the declared settings with DECLARED_THRESHOLDS,
    # any other with THRESHOLDS, the constants it ships (not the limits derived above from
    # these very replays, which no replay of this run can exceed by construction).
    client_flags = sum(
        not judge(d, (CLIENT_DECLARED if source == DECLARED else CLIENT_THRESHOLDS)[c]).ok
        for (source, c, _), ds in honest.items() if source != EXCLUDED for d in ds)
    false_positive_rate_client = ((client_flags + honest_screened)
                                  / max(1, len(counted) + honest_results))
    print(f"with the client's own limits (followers.py THRESHOLDS, DECLARED_THRESHOLDS; seeds "
          f"{args.first_seed}..{args.first_seed + args.seeds - 1}): {client_flags} of "
          f"{len(counted)} honest replays over them")

    print("attacks (judged against the `mixed` shadow with the thresholds of the swarm's "
          "dtype, and by the screen); the distances' low tail:")
    rates = detection(attacks, lambda j, c: flagged(j, measured[c]), lambda j: j.distances)
    print(f"copy: {victims_out} of {victims} copied honest originals left out by the screen "
          "(with their copier)")
    print("attacks judged by a follower replaying in the trainer's declared settings "
          "(declared thresholds), and by the screen; the distances' low tail:")
    rates_declared = detection(attacks, lambda j, c: flagged_declared(j, declared_limits[c]),
                               lambda j: j.declared)
    report: dict[str, object] = {
        **{f"detect_rate_{name}": round(rate, 4) for name, rate in rates.items()},
        **{f"detect_rate_declared_{name}": round(rate, 4)
           for name, rate in rates_declared.items()}}

    def least(names: Sequence[tuple[float, str]], by: dict[str, float] = rates) -> float | None:
        caught = [strength for strength, name in names if by.get(name, 0.0) >= 0.95]
        return min(caught) if caught else None

    flips = [(p, f"sign_flip_{p:g}") for p in SIGN_FLIP_PCTS]
    scales = [(x, f"scale_{x:g}") for x in SCALES]
    lazies = [(100 - p, f"lazy_{p}") for p in LAZY_PCTS]
    min_flip, min_scale, min_lazy = least(flips), least(scales), least(lazies)
    minima_declared = {"min_detected_sign_flip_pct_declared": least(flips, rates_declared),
                       "min_detected_scale_declared": least(scales, rates_declared),
                       "min_detected_lazy_pct_declared": least(lazies, rates_declared)}

    gross = [*GROSS, *(n for n in rates if n.startswith("copy_pos"))]
    ratios: dict[str, float] = {}
    delay_compute: ComputeDType = computes[-1]
    declared_followers = args.loss_followers == "declared"
    follower_sources = DECLARED_FOLLOWERS if declared_followers else FOLLOWER_SOURCES
    loss_limits = (declared_limits if declared_followers else measured)[delay_compute]
    print(f"loss runs: {args.delay_peers} honest clients + the attacker, {delay_compute}, "
          f"{args.delay_steps} steps, ejection {args.report_rounds} rounds after the verdict; "
          f"followers on {', '.join(follower_sources)} with {loss_limits}")
    if args.skip_loss:
        loss_attacks = ()
    cleans = {one_bit: delay_run(None, one_bit, 0, args.delay_steps, args.delay_peers,
                                 loss_limits, args.report_rounds, delay_compute,
                                 follower_sources)
              for one_bit in {one_bit for _, one_bit in loss_attacks}}
    for attack, one_bit in loss_attacks:
        mode = "1bit" if one_bit else "values"
        clean = cleans[one_bit]
        lost = delay_run(attack, one_bit, 0, args.delay_steps, args.delay_peers,
                         loss_limits, args.report_rounds, delay_compute, follower_sources)
        ratios[f"{attack}_{mode}"] = lost.final_loss / clean.final_loss
        print(f"  {attack:>16} {mode:>6}: ejected from round {lost.ejected_at}, "
              f"{lost.applied} forged results applied, {lost.screened} screened out, "
              f"final loss {lost.final_loss:.4f} vs clean {clean.final_loss:.4f} "
              f"({ratios[f'{attack}_{mode}']:.4f})", flush=True)
    worst = max(ratios, key=lambda k: ratios[k]) if ratios else None
    print(f"[{time.perf_counter() - started:.0f} s] done; the worst loss ratio: {worst}")

    p99 = {m: quantile([getattr(d, m) for d, _ in counted], 0.99) for m in METRICS}
    print(json.dumps({
        "false_positive_rate": round(false_positive_rate, 6),
        "honest_verifications": len(counted),
        "honest_screened": honest_results,
        **{f"honest_p99_{m}": round(v, 5) for m, v in p99.items()},
        **report,
        "min_detected_sign_flip_pct": min_flip,
        "min_detected_scale": min_scale,
        "min_detected_lazy_pct": min_lazy,
        "gross_min_detect_rate": round(min(rates[g] for g in gross if g in rates), 4),
        "gross_min_detect_rate_declared": round(
            min(rates_declared[g] for g in gross if g in rates_declared), 4),
        "copy_originals_left_out": victims_out,
        "loss_with_attacker_vs_clean": round(ratios[worst], 4) if worst else None,
        "thresholds": {c: {m: round(getattr(t, m), 4) for m in METRICS}
                       for c, t in measured.items()},
        "false_positive_rate_declared": round(false_positive_rate_declared, 6),
        "honest_declared_verifications": len(declared_counted),
        "false_positive_rate_client": round(false_positive_rate_client, 6),
        **minima_declared,
        "thresholds_declared": {c: {m: round(getattr(t, m), 4) for m in METRICS}
                                for c, t in declared_limits.items()},
        "steps": args.steps, "peers": args.peers, "seeds": args.seeds,
        "first_seed": args.first_seed,
        "delay_steps": args.delay_steps, "delay_peers": args.delay_peers,
        "report_rounds": args.report_rounds, "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
