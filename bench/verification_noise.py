"""One honest swarm, replayed by verifiers on other machines (bench/verification.py).

`follow_run` trains `peers` honest clients (DistroTrainer, the tiny model, CPU, each on
its own copy of the model; all apply every result, so the copies stay identical) in one
trainer setup (verification_attacks.trainer_setup: 1 thread, micro-batch = the batch,
math SDPA). Every client's assigned batch is replayed at every step by one shadow per
noise source (verification_attacks.noise_sources: another thread count, micro-batch split,
SDPA kernel, all three, oneDNN off, the other dtype, or `declared`: the trainer's own
settings, as a follower replays in them when the trainer declares them), each continuing
from its own honest results as a follower's does; every honest result against every
shadow is one honest verification.

Against the `mixed` shadow (the most different honest machine) and the `declared` one the
run also judges the attacks: post-hoc ones on every client's honest result, the copy at every batch position,
and the lazy trainers (their own trainers, claiming client 1's batch). The cheap checks
run as a client screens: `screen` over the step's results in batch order, the attacker's
result in its place, against each sender's previous result. The attacks are never applied
here: detection is judged on the honest trajectory (bench/verification_delay.py applies
them, with the protocol's delay).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.verification_attacks import (
    DECLARED_SOURCE,
    LAZY,
    POST_HOC,
    REFERENCE_SOURCE,
    WRONG_BATCH_OFFSET,
    Setup,
    first_micro_batch_only,
    lazy_batch,
    noise_sources,
    post_hoc,
    trainer_setup,
)
from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import DistroResult, encode_result
from client_image.training.model import load_causal_lm
from client_image.training.objective import causal_lm_loss
from client_image.training.precision import ComputeDType
from client_image.training.trainer import DistroTrainer
from client_image.verification import ReplayVerifier
from client_image.verification.checks import CheapCheck, Fingerprint, fingerprint, screen
from client_image.verification.similarity import Distances
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "assets" / "tiny-llama"
REPO_DATA = REPO / "assets" / "data" / "train"
SEQ_LEN, PER_PEER = 64, 2
SCHEDULE = ConstantLR(base_lr=2e-3, warmup_init_lr=0.0, warmup_steps=3)
SEED_ROWS = 3000  # each seed trains on its own rows of the data


def optimizer(one_bit: bool) -> DistroOptimizer:
    return DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                           quantize_1bit=one_bit, clip_grad_norm=1.0, weight_decay=0.1)


@dataclass(frozen=True)
class Judged:
    """One verification: the replay's distances (the `mixed` shadow's), the cheap check
    that failed, if any, and the distances from a replay in the trainer's declared
    settings (the `declared` shadow's)."""

    distances: Distances
    cheap: str | None = None
    declared: Distances | None = None


@dataclass
class FollowRun:
    honest: dict[str, list[Distances]] = field(default_factory=dict)  # by noise source
    attacks: dict[str, list[Judged]] = field(default_factory=dict)
    copy_victims_left_out: int = 0  # honest originals the screen left out with a copy
    copy_victims: int = 0
    honest_results: int = 0  # honest results screened (no attacker in the step)
    honest_left_out: int = 0

    def attack(self, name: str, judged: Judged) -> None:
        self.attacks.setdefault(name, []).append(judged)


def batch_rows(seed: int, step: int, client: int, clients: int) -> tuple[int, int]:
    start = seed * SEED_ROWS + (step * clients + client) * PER_PEER
    return start, start + PER_PEER - 1


def make_trainer(model: torch.nn.Module, one_bit: bool, setup: Setup,
                 lazy: str | None = None) -> DistroTrainer:
    loss = first_micro_batch_only if lazy == "lazy_microbatch" else causal_lm_loss
    micro = 1 if lazy == "lazy_microbatch" else setup.micro
    return DistroTrainer(model, optimizer(one_bit), SCHEDULE, micro_batch_size=micro,
                         compute=setup.compute, loss_fn=loss)


def encode_as(tensors: list[SparseResult], trainer: DistroTrainer, step: int,
              rows: tuple[int, int], one_bit: bool) -> bytes:
    return encode_result(tensors, trainer.plans, step=step, trainer_nonce=step,
                         batch_start=rows[0], batch_end=rows[1], one_bit=one_bit)


@dataclass
class StepView:
    """What one step of follow_run judges an attacker's result against."""

    step: int
    learning_rate: float
    rows: dict[int, tuple[int, int]]
    results: dict[int, DistroResult]
    previous: dict[int, DistroResult]
    expected: dict[tuple[str, int], DistroResult]
    trainers: list[DistroTrainer]
    shadows: dict[tuple[str, int], ReplayVerifier]
    one_bit: bool

    prints: dict[int, Fingerprint] = field(default_factory=dict)
    earlier: dict[str, Fingerprint] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Fingerprinted once: every attack of the step screens against the same results.
        plans = self.trainers[0].plans
        self.prints = {i: fingerprint(r, plans) for i, r in self.results.items()}
        self.earlier = {str(i): fingerprint(r, plans) for i, r in self.previous.items()}

    def screened(self, position: int, result: DistroResult) -> dict[int, CheapCheck]:
        """The step's screen with `result` in the place of `position`'s honest one."""
        listed: list[tuple[str, DistroResult | Fingerprint]] = [
            (str(i), result if i == position else honest)
            for i, honest in sorted(self.prints.items())]
        return screen(listed, self.trainers[0].plans, self.earlier, self.learning_rate)

    def judge(self, position: int, result: DistroResult) -> Judged:
        check = self.screened(position, result).get(position)
        key = (REFERENCE_SOURCE, position)
        distances = self.shadows[key].distances(result, self.expected[key])
        exact = (DECLARED_SOURCE, position)
        declared = self.shadows[exact].distances(result, self.expected[exact])
        return Judged(distances, check.name if check else None, declared)

    def forged(self, tensors: list[SparseResult], position: int) -> DistroResult | None:
        """The forged result as the wire carries it; None when it is the honest one's
        bytes (a scale in 1-bit mode, anything at a learning rate of 0)."""
        trainer, rows = self.trainers[position], self.rows[position]
        payload = encode_as(tensors, trainer, self.step, rows, self.one_bit)
        honest = encode_as(list(self.results[position].tensors), trainer, self.step, rows,
                           self.one_bit)
        return None if payload == honest else trainer.decode(payload)


def follow_run(one_bit: bool, seed: int, compute: ComputeDType, steps: int,
               peers: int, lazy_kinds: tuple[str, ...] = LAZY) -> FollowRun:
    torch.manual_seed(seed)
    rng = torch.Generator().manual_seed(1000 + seed)
    data = LocalDataProvider(REPO_DATA, SEQ_LEN)
    models = [load_causal_lm(TINY, device="cpu") for _ in range(peers)]
    own = trainer_setup(compute, PER_PEER)
    trainers = [make_trainer(m, one_bit, own) for m in models]
    sources = noise_sources(compute, PER_PEER)
    # Shadows and lazy trainers run on client 0's model before its own training of the step
    # (decay_weights=False leaves the weights exactly as they were).
    shadows = {(name, c): ReplayVerifier(make_trainer(models[0], one_bit, setup))
               for name, setup in sources.items() for c in range(peers)}
    lazy_id = 1 % peers
    lazies = {name: make_trainer(models[0], one_bit, own, lazy=name) for name in lazy_kinds}
    run = FollowRun()
    previous: dict[int, DistroResult] = {}
    applied: dict[int, list[DistroResult]] = {}
    honest_results: dict[int, dict[int, DistroResult]] = {}
    for step in range(steps):
        if step >= 2:
            for trainer in trainers:
                trainer.apply(step, applied[step - 2])
            # As the runtime does (followers.py): a result is verified, and its honest
            # result adopted by the shadows, at its apply, after the next step's replay.
            for (_name, c), shadow in shadows.items():
                shadow.adopt(step - 2, honest_results[step - 2][c])
        rows = {c: batch_rows(seed, step, c, peers) for c in range(peers)}
        expected: dict[tuple[str, int], DistroResult] = {}
        for (name, c), shadow in shadows.items():
            with sources[name].active():
                expected[(name, c)] = shadow.expected(step, data.get_samples(*rows[c]), rows[c])
        lazy_results: dict[str, DistroResult] = {}
        for name, lazy in lazies.items():
            claimed = rows[lazy_id]
            # Another batch far from every assigned one, wrapped around the data set (later
            # seeds' rows plus the offset run past its end).
            wrong = (claimed[0] + WRONG_BATCH_OFFSET) % (data.num_sequences - PER_PEER)
            source = (wrong, wrong + PER_PEER - 1) if name == "wrong_batch" else claimed
            with own.active():
                out = lazy.train(step, lazy_batch(name, data.get_samples(*source)),
                                 batch_id=claimed, decay_weights=False)
            assert out.payload is not None
            lazy_results[name] = lazy.decode(out.payload)
        results: dict[int, DistroResult] = {}
        for c, trainer in enumerate(trainers):
            with own.active():
                out = trainer.train(step, data.get_samples(*rows[c]), batch_id=rows[c])
            assert out.payload is not None
            results[c] = trainer.decode(out.payload)
        honest_results[step] = results
        for (name, c), exp in expected.items():
            run.honest.setdefault(name, []).append(shadows[(name, c)].distances(results[c], exp))
        view = StepView(step, trainers[0].learning_rate(step), rows, results, previous,
                        expected, trainers, shadows, one_bit)
        run.honest_results += peers
        run.honest_left_out += len(view.screened(0, results[0]))
        for c in range(peers):
            peer = results[(c + 1) % peers]
            for name in POST_HOC:
                tensors = post_hoc(name, results[c], previous.get(c), peer, rng)
                attacked = None if tensors is None else view.forged(tensors, c)
                if attacked is not None:
                    run.attack(name, view.judge(c, attacked))
            # The copier at position c sends the next position's result as its own.
            victim = (c + 1) % peers
            copied = view.forged(list(results[victim].tensors), c)
            if copied is not None and victim != c:
                run.attack(f"copy_pos{c}", view.judge(c, copied))
                run.copy_victims += 1
                run.copy_victims_left_out += victim in view.screened(c, copied)
        for name, result in lazy_results.items():
            if view.forged(list(result.tensors), lazy_id) is not None:
                run.attack(name, view.judge(lazy_id, result))
        applied[step] = [results[c] for c in range(peers)]
        previous = results
    return run

