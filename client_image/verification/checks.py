"""Checks any client can make on any peer's result, with no recompute.

    empty        every slot empty while the learning rate is positive: a result that moves
                 nothing (a free rider's zeros); at a learning rate of 0 an honest result
                 *is* empty, and one that is not fails as `not_empty`
    underfilled  under a tenth of the slots kept: an honest delta is nonzero almost
                 everywhere (only the embedding rows of tokens no batch has seen yet stay
                 zero early on), so its top-k fills nearly every block
    copy         agrees with another result of the same step on >= 1 - NEAR of the
                 sketched slots (same index, same sign): a re-signed copy, or a near copy
                 (in a screen, both of them fail: `screen`)
    repeat       agrees so with the sender's own previous result: a stale replay (error
                 feedback removes what a client sent, so its consecutive results share few
                 indices: honest pairs agree on ~1-5% of slots, measured over 200 steps)

The slot sketch: the (index, sign) of up to SKETCH_SLOTS slots at evenly spaced positions
of the result, so comparing all pairs of a step's results stays cheap for any model. A
near copy that differs only outside the sketch is not a `copy` (replay still catches it).

The structure itself (sizes, indices in range, step, quantization) is the wire decoder's
job (formats/distro_wire.py): a result that reaches these checks already decoded. Every check is
a pure function of its inputs, so clients screening the same consensus results leave out
the same ones (runtime/round_runner.py).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from client_image.formats.blocks import BlockPlan
from client_image.formats.distro_wire import DistroResult, ResultDecodeError

NEAR = 0.05
SKETCH_SLOTS = 65_536


@dataclass(frozen=True)
class Fingerprint:
    """All the cheap checks read of a result: its step, fill fraction and slot sketch. A
    client keeps this (at most SKETCH_SLOTS int32) from each download instead of the
    decoded result, which is as large as the payload's coefficients."""

    step: int
    fill: float
    sketch: torch.Tensor


def fingerprint(result: DistroResult | Fingerprint, plans: Sequence[BlockPlan]) -> Fingerprint:
    if isinstance(result, Fingerprint):
        return result
    return Fingerprint(result.step, fill_fraction(result, plans), sketch(result).to(torch.int32))


@dataclass(frozen=True)
class CheapCheck:
    name: str  # empty | not_empty | underfilled | copy | repeat
    detail: str


def fill_fraction(result: DistroResult, plans: Sequence[BlockPlan]) -> float:
    kept = sum(int((t.val != 0).sum()) for t in result.tensors)
    slots = sum(plan.n_blocks * plan.topk for plan in plans)
    return kept / slots if slots else 0.0


def sketch(result: DistroResult) -> torch.Tensor:
    """Codes of evenly spaced slots: 2 x (index in its block) + sign, -1 when empty. Two
    results of one model have the same slots (parameter, block, rank), so codes compare
    position by position."""
    codes = []
    for tensor in result.tensors:
        idx, val = tensor.idx.reshape(-1), tensor.val.reshape(-1)
        codes.append(torch.where(val != 0, idx * 2 + (val < 0).to(idx.dtype), -1))
    flat = torch.cat(codes) if codes else torch.empty(0, dtype=torch.int64)
    if flat.numel() <= SKETCH_SLOTS:
        return flat
    positions = torch.linspace(0, flat.numel() - 1, SKETCH_SLOTS).round().long()
    return flat[positions]


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of the sketched slots two results fill alike (same index and sign)."""
    if a.shape != b.shape or a.numel() == 0:
        return 0.0
    filled = (a >= 0) | (b >= 0)
    if not bool(filled.any()):
        return 1.0
    return float(((a == b) & filled).sum()) / float(filled.sum())


Checked = DistroResult | Fingerprint


def cheap_checks(result: Checked, plans: Sequence[BlockPlan], *,
                 others: Mapping[str, Checked], previous: Checked | None,
                 learning_rate: float, near: float = NEAR) -> list[CheapCheck]:
    """Every cheap check `result` fails (empty list: it passes them all).

    `others`: results of the same step to compare with (in a screen, all the others), by
    name; `previous`: the sender's own result of an earlier step, if any;
    `learning_rate`: the run's at the result's step."""
    mine = fingerprint(result, plans)
    filled = mine.fill
    if learning_rate == 0:
        return [] if filled == 0 else [CheapCheck("not_empty", "the learning rate is 0, "
                                                  "but the result moves weights")]
    if filled == 0:
        return [CheapCheck("empty", "every slot of the result is empty")]
    failed = []
    if filled < 0.1:
        failed.append(CheapCheck("underfilled", f"{filled:.1%} of the slots kept"))
    for name, other in others.items():
        same = agreement(mine.sketch, fingerprint(other, plans).sketch)
        if same >= 1 - near:
            failed.append(CheapCheck("copy", f"{same:.1%} of its slots are {name}'s"))
    if previous is not None:
        earlier = fingerprint(previous, plans)
        same = agreement(mine.sketch, earlier.sketch)
        if same >= 1 - near:
            failed.append(CheapCheck("repeat", f"{same:.1%} of its slots repeat its result "
                                               f"of step {earlier.step}"))
    return failed


def screen(results: Sequence[tuple[str, Checked]], plans: Sequence[BlockPlan],
           previous: Mapping[str, Checked], learning_rate: float) -> dict[int, CheapCheck]:
    """The results of one step a client leaves out of its apply, by position: each result
    is checked against every other result of the step and its sender's previous result.

    Of two copies both are left out: a copier re-signs the original under its own header,
    so nothing in the results tells which came first, and keeping the first in batch
    order let a copier with an earlier batch position keep its copy while the honest
    original was left out (bench/verification.py, copy_pos*). The copier keeps nothing;
    the original loses this step's result, and the copier's followers report it (its
    result is not its batch's replay)."""
    prints = [(sender, fingerprint(result, plans)) for sender, result in results]
    left_out: dict[int, CheapCheck] = {}
    for position, (sender, print_) in enumerate(prints):
        others = {f"{other} (position {i})": p for i, (other, p) in enumerate(prints)
                  if i != position}
        failed = cheap_checks(print_, plans, others=others, previous=previous.get(sender),
                              learning_rate=learning_rate)
        if failed:
            left_out[position] = failed[0]
    return left_out


def screen_payloads(results: Sequence[tuple[bytes, bytes]], previous: Mapping[bytes, bytes],
                    fingerprint_of: Callable[[bytes], Fingerprint],
                    plans: Sequence[BlockPlan], learning_rate: float) -> dict[int, tuple[str, str]]:
    """`screen` over a step's (sender key, payload) pairs and each sender's previous
    payload: the positions left out with (check name, detail). A payload whose
    fingerprint cannot be had (`fingerprint_of` raises ResultDecodeError; results are
    decoded on download, so never expected) is left out as `undecodable`."""
    left_out: dict[int, tuple[str, str]] = {}
    checked: list[tuple[str, Fingerprint]] = []
    positions: list[int] = []
    for position, (sender, payload) in enumerate(results):
        try:
            checked.append((sender.hex(), fingerprint_of(payload)))
            positions.append(position)
        except ResultDecodeError as exc:
            left_out[position] = ("undecodable", str(exc))
    earlier = {}
    for sender, payload in previous.items():
        with contextlib.suppress(ResultDecodeError):
            earlier[sender.hex()] = fingerprint_of(payload)
    for index, check in screen(checked, plans, earlier, learning_rate).items():
        left_out[positions[index]] = (check.name, check.detail)
    return left_out


class FingerprintCache:
    """sha256(payload) -> Fingerprint of the results a client downloaded, so that the
    screen at apply reads the fingerprint, not a second decode. Thread-safe enough for one
    writer on the event loop and one reader in the worker thread (dict operations only)."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, Fingerprint] = {}

    def add(self, payload: bytes, print_: Fingerprint) -> None:
        self._by_digest[hashlib.sha256(payload).digest()] = print_

    def get(self, payload: bytes) -> Fingerprint | None:
        return self._by_digest.get(hashlib.sha256(payload).digest())

    def forget_before(self, step: int, keep: Iterable[bytes]) -> None:
        """Drop fingerprints of results of steps before `step`, except `keep`'s."""
        kept = {hashlib.sha256(payload).digest() for payload in keep}
        for digest, print_ in list(self._by_digest.items()):
            if print_.step < step and digest not in kept:
                self._by_digest.pop(digest, None)

    def __len__(self) -> int:
        return len(self._by_digest)
