"""Checks any client can make on any peer's result, with no recompute.

    empty        every slot empty: a result that moves nothing (a free rider's zeros)
    underfilled  fewer than half of the slots kept: an honest delta is nonzero almost
                 everywhere, so its top-k fills every block
    copy         within `near` (Jaccard and Hamming) of another client's result of the
                 same step: a re-signed copy, or a near copy with a few slots changed
    repeat       within `near` of this sender's own previous result: a stale replay. An
                 honest client's consecutive results share few indices, since error
                 feedback removes what was sent from its delta.

The structure itself (sizes, indices in range, step, quantization) is the wire decoder's
job (training/wire.py): a result that reaches these checks already decoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from client_image.training.distro import BlockPlan
from client_image.training.wire import DistroResult
from client_image.verification.similarity import similarity

NEAR = 0.05


@dataclass(frozen=True)
class CheapCheck:
    name: str  # empty | underfilled | copy | repeat
    detail: str


def fill_fraction(result: DistroResult, plans: Sequence[BlockPlan]) -> float:
    kept = sum(int((t.val != 0).sum()) for t in result.tensors)
    slots = sum(plan.n_blocks * plan.topk for plan in plans)
    return kept / slots if slots else 0.0


def cheap_checks(result: DistroResult, plans: Sequence[BlockPlan], *,
                 others: Mapping[str, DistroResult], previous: DistroResult | None,
                 learning_rate: float, near: float = NEAR) -> list[CheapCheck]:
    """Every cheap check `result` fails (empty list: it passes them all).

    `others`: the same step's results of other clients, by name; `previous`: the sender's
    own result of an earlier step, if any; `learning_rate`: the run's at this step (at
    a learning rate of 0, as at the first warm-up step, an honest result is empty)."""
    failed = []
    numels = [plan.block_numel for plan in plans]
    filled = fill_fraction(result, plans)
    if learning_rate == 0:
        return [] if filled == 0 else [CheapCheck("not_empty", "the learning rate is 0, "
                                                  "but the result moves weights")]
    if filled == 0:
        return [CheapCheck("empty", "every slot of the result is empty")]
    if filled < 0.5:
        failed.append(CheapCheck("underfilled", f"{filled:.1%} of the slots kept"))
    for name, other in others.items():
        distance = similarity(result.tensors, other.tensors, numels).overall
        if distance.jaccard <= near and distance.hamming <= near:
            failed.append(CheapCheck("copy", f"within {near} of {name}'s result "
                                             f"(jaccard {distance.jaccard:.3f}, "
                                             f"hamming {distance.hamming:.3f})"))
    if previous is not None:
        distance = similarity(result.tensors, previous.tensors, numels).overall
        if distance.jaccard <= near and distance.hamming <= near:
            failed.append(CheapCheck("repeat", f"within {near} of its result of step "
                                               f"{previous.step}"))
    return failed
