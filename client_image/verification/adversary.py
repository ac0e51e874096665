"""Dishonest results, to test verification against (bench/verification.py, the client's
`--test-adversary`, the e2e run). Never used by an honest client.

    random_signs   the honest indices and magnitudes with random signs
    scaled         the honest result x 10
    stale          the client's previous result again
    copy           another client's result of the step (bench only: a live client has
                   no peer's result before it publishes its own)
    zeros          every slot empty
    flipped_signs  the honest result with 10% of its signs flipped
    wrong_batch    an honest computation on other tokens (the batch shifted along the
                   sequence), so the result is well-formed and trained, just not on the
                   assigned data
"""

from __future__ import annotations

import torch

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import DistroResult, encode_result
from client_image.verification.replay import ShadowTrainer

ATTACKS = ("random_signs", "scaled", "stale", "copy", "wrong_batch", "zeros", "flipped_signs")
LIVE_ATTACKS = tuple(a for a in ATTACKS if a != "copy")


def attacked_tensors(kind: str, honest: DistroResult, previous: DistroResult | None,
                     peer: DistroResult | None, rng: torch.Generator) -> list[SparseResult]:
    """The attacker's tensors for this step (wrong_batch changes the batch instead)."""
    if kind == "random_signs":
        return [SparseResult(t.idx, t.val.abs() * (torch.randint(0, 2, t.val.shape, generator=rng)
                                                   * 2 - 1).to(t.val.dtype))
                for t in honest.tensors]
    if kind == "scaled":
        return [SparseResult(t.idx, t.val * 10) for t in honest.tensors]
    if kind == "stale":
        return list((previous or honest).tensors)
    if kind == "copy":
        return list((peer or honest).tensors)
    if kind == "zeros":
        return [SparseResult(torch.zeros_like(t.idx), torch.zeros_like(t.val))
                for t in honest.tensors]
    if kind == "flipped_signs":
        out = []
        for t in honest.tensors:
            flip = torch.rand(t.val.shape, generator=rng) < 0.1
            out.append(SparseResult(t.idx, torch.where(flip, -t.val, t.val)))
        return out
    return list(honest.tensors)


class Adversary:
    """Turns a live client's honest results into `kind`'s dishonest ones."""

    def __init__(self, kind: str, seed: int = 0) -> None:
        if kind not in LIVE_ATTACKS:
            raise ValueError(f"unknown adversary {kind!r}: use one of {', '.join(LIVE_ATTACKS)}")
        self.kind = kind
        self.previous: DistroResult | None = None
        self.rng = torch.Generator().manual_seed(seed)

    def batch(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.roll(tokens, shifts=7, dims=-1) if self.kind == "wrong_batch" else tokens

    def payload(self, honest: bytes, trainer: ShadowTrainer) -> bytes:
        if self.kind == "wrong_batch":
            return honest
        result = trainer.decode(honest)
        tensors = attacked_tensors(self.kind, result, self.previous, None, self.rng)
        self.previous = result
        return encode_result(tensors, trainer.plans, step=result.step,
                             trainer_nonce=result.trainer_nonce, batch_start=result.batch_start,
                             batch_end=result.batch_end, one_bit=result.one_bit,
                             settings=result.settings)  # as declared: the tight limits
