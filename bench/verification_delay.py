"""The attacker's effect on loss with the protocol's real delay (bench/verification.py).

`delay_run` trains `peers` honest clients and one attacker at batch position 0 (so a
copier copies position 1: it is ahead of its original), all applying the step's kept
results as clients do. What leaves an attacker's result out, and when:

- the cheap checks, at once: every client screens the step's results (checks.screen, in
  batch order, against each sender's previous result) before applying them;
- replay, late: two followers (the first honest client's machine, replaying on the
  `mixed` and `microbatch` noise setups) replay the attacker's claimed batch at step s and
  judge its result at the apply of s, round s + 2, with the client's thresholds; each
  failing follower reports (one report per trainer and epoch); the second report ejects,
  and from round s + 2 + `report_rounds` on no apply takes the attacker's results. With
  report_rounds = 1 the ejection is at the next round's start (docs/verification.md);
  the bench's default, 2, also lets the reports land a round late. Until then every
  attacker result the screen keeps is applied by every client.

The attacker is followed from the epoch's start (a follow plan with p < 100 watches a
given trainer in an epoch with probability about p / 100; this is the watched case).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.verification_attacks import (
    LAZY,
    WRONG_BATCH_OFFSET,
    lazy_batch,
    noise_sources,
    post_hoc,
    trainer_setup,
)
from bench.verification_noise import (
    PER_PEER,
    REPO_DATA,
    SEQ_LEN,
    TINY,
    batch_rows,
    encode_as,
    make_trainer,
)
from client_image.formats.distro_wire import DistroResult
from client_image.training.model import load_causal_lm
from client_image.training.precision import ComputeDType
from client_image.verification import ReplayVerifier, Thresholds
from client_image.verification.checks import screen
from client_image.verification.replay import judge
from psyche_common.token_files.local import LocalDataProvider

FOLLOWER_SOURCES = ("mixed", "microbatch")
DECLARED_FOLLOWERS = ("declared", "declared")  # both replay in the trainer's settings
ATTACKER = 0


@dataclass(frozen=True)
class DelayRun:
    final_loss: float  # the honest clients' mean loss over the last 5 steps
    ejected_at: int | None  # the first round whose apply leaves the attacker out
    applied: int  # attacker results (that differ from its honest ones) applied
    screened: int  # attacker results the cheap checks left out


def delay_run(attack: str | None, one_bit: bool, seed: int, steps: int, peers: int,
              thresholds: Thresholds, report_rounds: int,
              compute: ComputeDType = "bf16",
              follower_sources: tuple[str, ...] = FOLLOWER_SOURCES) -> DelayRun:
    torch.manual_seed(seed)
    rng = torch.Generator().manual_seed(2000 + seed)
    data = LocalDataProvider(REPO_DATA, SEQ_LEN)
    own = trainer_setup(compute, PER_PEER)
    clients = peers + 1  # the layout keeps the attacker's slot in the clean run too
    positions = list(range(clients)) if attack else list(range(1, clients))
    models = {p: load_causal_lm(TINY, device="cpu") for p in positions}
    trainers = {p: make_trainer(models[p], one_bit, own,
                                lazy=attack if p == ATTACKER and attack in LAZY else None)
                for p in positions}
    verifier = positions[1] if attack else positions[0]
    sources = noise_sources(compute, PER_PEER)
    # Keyed "<i>:<source>": two followers may replay in the same setup.
    followers = {f"{i}:{name}": ReplayVerifier(make_trainer(models[verifier], one_bit,
                                                            sources[name]))
                 for i, name in enumerate(follower_sources)} if attack else {}
    kept: dict[int, dict[int, DistroResult]] = {}
    sent: dict[int, dict[int, DistroResult]] = {}
    forged_steps: set[int] = set()
    expected: dict[int, dict[str, DistroResult]] = {}
    reported: set[str] = set()
    ejected_at: int | None = None
    applied = screened = 0
    losses: list[float] = []
    previous_honest: DistroResult | None = None
    for step in range(steps):
        if step >= 2:
            ejected = ejected_at is not None and step >= ejected_at
            results = [r for p, r in sorted(kept[step - 2].items())
                       if not (p == ATTACKER and ejected)]
            applied += (ATTACKER in kept[step - 2] and not ejected
                        and step - 2 in forged_steps)
            for trainer in trainers.values():
                trainer.apply(step, results)
            # The followers judge the attacker's result of step - 2 at this apply.
            if ATTACKER in sent.get(step - 2, {}):
                for name, follower in followers.items():
                    verdict = judge(follower.distances(sent[step - 2][ATTACKER],
                                                       expected[step - 2][name]), thresholds)
                    if not verdict.ok and name not in reported:
                        reported.add(name)  # one report per trainer and epoch
                        if len(reported) == 2 and ejected_at is None:
                            ejected_at = step + report_rounds
        rows = {p: batch_rows(seed, step, p, clients) for p in positions}
        if attack and (ejected_at is None or step < ejected_at):
            expected[step] = {}
            for name, follower in followers.items():
                with sources[name.split(":", 1)[1]].active():
                    expected[step][name] = follower.expected(
                        step, data.get_samples(*rows[ATTACKER]), rows[ATTACKER])
        results_now: dict[int, DistroResult] = {}
        for p, trainer in trainers.items():
            if p == ATTACKER and ejected_at is not None and step >= ejected_at:
                continue  # an ejected client stops training until the next epoch
            tokens = data.get_samples(*rows[p])
            if p == ATTACKER and attack == "wrong_batch":
                tokens = data.get_samples(rows[p][0] + WRONG_BATCH_OFFSET,
                                          rows[p][1] + WRONG_BATCH_OFFSET)
            elif p == ATTACKER and attack in LAZY:
                tokens = lazy_batch(attack, tokens)
            with own.active():
                out = trainer.train(step, tokens, batch_id=rows[p])
            assert out.payload is not None
            results_now[p] = trainer.decode(out.payload)
            if p != ATTACKER:
                losses.append(out.loss)
        if ATTACKER in results_now and attack and attack not in LAZY:
            honest = results_now[ATTACKER]
            tensors = (list(results_now[1].tensors) if attack == "copy_pos0"
                       else post_hoc(attack, honest, previous_honest, results_now[1], rng))
            previous_honest = honest
            if tensors is not None:
                payload = encode_as(tensors, trainers[ATTACKER], step, rows[ATTACKER], one_bit)
                if payload != encode_as(list(honest.tensors), trainers[ATTACKER], step,
                                        rows[ATTACKER], one_bit):
                    forged_steps.add(step)
                results_now[ATTACKER] = trainers[ATTACKER].decode(payload)
        elif ATTACKER in results_now and attack in LAZY and any(
                bool((t.val != 0).any()) for t in results_now[ATTACKER].tensors):
            forged_steps.add(step)
        listed = [(str(p), r) for p, r in sorted(results_now.items())]
        earlier = {str(p): r for p, r in sent.get(step - 1, {}).items()}
        lr = trainers[positions[-1]].learning_rate(step)
        left_out = screen(listed, trainers[positions[-1]].plans, earlier, lr)
        order = sorted(results_now)
        kept[step] = {p: r for i, (p, r) in enumerate(sorted(results_now.items()))
                      if i not in left_out}
        screened += sum(order[i] == ATTACKER and step in forged_steps for i in left_out)
        sent[step] = results_now
    tail = losses[-5 * peers:]
    return DelayRun(sum(tail) / len(tail), ejected_at, applied, screened)
