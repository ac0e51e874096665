"""The trainer of an `optimizer = "Dummy"` run (Psyche's config/test): no learning.

    DummyTrainer(*, delay_s=0.0)
        .train(step, batch, *, batch_id, cold_start) -> TrainStepOutput   sleeps delay_s
        .decode(payload) -> DistroResult       a peer's Dummy result (ResultDecodeError)
        .apply_payloads(step, payloads) -> int  counts step - 2's results, moves nothing
        .learning_rate(step) -> 0.0 ; .plans == [] ; .idle(step) ; .reset_delta()
    encode_dummy_result(step, trainer_nonce, batch_start, batch_end) -> bytes
    decode_dummy_result(payload) -> DistroResult
    DUMMY_MAGIC, DUMMY_RESULT_SIZE

A step runs no forward or backward pass: it sleeps the client's
--dummy-training-delay-secs (Psyche's flag, for the time a real step would take) and
publishes a 30-byte result, so a run exercises the whole protocol (rounds, witnesses,
results shared, downloaded, screened and applied, checkpoints) while every client's
weights stay the checkpoint's. The reported loss is 0: nothing is computed.

Wire (little-endian): magic "PSDY" | version u16 | step u32 | trainer_nonce u32 |
batch_start u64 | batch_end u64. A decoded result is a DistroResult with no tensors, so
the cheap checks (verification/checks.py) read it as an empty result at learning rate 0,
which is what an honest Dummy result is; anything else (another length, magic, version,
a reversed batch range, a DisTrO or SparseLoCo payload) fails to decode.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence

import torch

from client_image.formats.blocks import BlockPlan
from client_image.formats.distro_wire import DistroResult, ResultDecodeError
from client_image.training.trainer import Timings, TrainStepOutput

DUMMY_MAGIC = b"PSDY"
DUMMY_WIRE_VERSION = 1
_FORMAT = struct.Struct("<4sHIIQQ")
DUMMY_RESULT_SIZE = _FORMAT.size


def encode_dummy_result(step: int, trainer_nonce: int, batch_start: int, batch_end: int) -> bytes:
    return _FORMAT.pack(DUMMY_MAGIC, DUMMY_WIRE_VERSION, step, trainer_nonce, batch_start,
                        batch_end)


def decode_dummy_result(payload: bytes) -> DistroResult:
    """A Dummy result's fields; ResultDecodeError, naming what is wrong, for anything else."""
    if len(payload) != DUMMY_RESULT_SIZE:
        raise ResultDecodeError(f"a Dummy result is {DUMMY_RESULT_SIZE} bytes, got "
                                f"{len(payload)}")
    magic, version, step, nonce, batch_start, batch_end = _FORMAT.unpack(payload)
    if magic != DUMMY_MAGIC:
        raise ResultDecodeError(f"bad magic {magic!r}, expected {DUMMY_MAGIC!r} (a Dummy "
                                "result)")
    if version != DUMMY_WIRE_VERSION:
        raise ResultDecodeError(f"Dummy result version {version}, expected "
                                f"{DUMMY_WIRE_VERSION}")
    if batch_end < batch_start:
        raise ResultDecodeError(f"Dummy result batch {batch_start}..{batch_end} is reversed")
    return DistroResult(step=step, trainer_nonce=nonce, batch_start=batch_start,
                        batch_end=batch_end, one_bit=False, tensors=[])


class DummyTrainer:
    """DistroTrainer's surface (what runtime/worker.py drives), training nothing."""

    def __init__(self, *, delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.delay_s = delay_s
        self.plans: list[BlockPlan] = []  # no parameter is shared
        self.trainer_nonce = 0
        self.timings = Timings()

    def learning_rate(self, step: int) -> float:
        """0 at every step: a Dummy result moves no weight (the cheap checks then accept
        exactly the empty results)."""
        del step
        return 0.0

    def train(self, step: int, batch: torch.Tensor, *, batch_id: tuple[int, int] = (0, 0),
              cold_start: bool = False) -> TrainStepOutput:
        del batch, cold_start
        started = time.perf_counter()
        if self.delay_s:
            time.sleep(self.delay_s)
        self.timings.forward_backward_s += time.perf_counter() - started
        payload = encode_dummy_result(step, self.trainer_nonce, batch_id[0], batch_id[1])
        self.trainer_nonce += 1
        return TrainStepOutput(step, 0.0, payload, 0.0, learning_rate=self.learning_rate(step))

    def decode(self, payload: bytes, expected_step: int | None = None) -> DistroResult:
        result = decode_dummy_result(payload)
        if expected_step is not None and result.step != expected_step:
            raise ResultDecodeError(f"payload is for step {result.step}, expected {expected_step}")
        return result

    def apply_payloads(self, step: int, payloads: Sequence[bytes]) -> int:
        """How many of `payloads` are results of step - 2 (as DisTrO's apply counts them);
        the weights are not touched."""
        applied = 0
        for payload in payloads:
            try:
                applied += decode_dummy_result(payload).step == step - 2
            except ResultDecodeError:
                continue
        return applied

    def idle(self, step: int) -> None:
        """A round this client sits out: nothing to keep in step."""

    def reset_delta(self) -> None:
        """There is no delta: every epoch starts alike."""
