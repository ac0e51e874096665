"""Declared replay settings (formats/replay_settings.py): they travel in a result's header
(flag bit 2), a result without them has the bytes it always had, every malformed section
is a ResultDecodeError naming the problem (never another exception), and a follower
judges with the tight limits only a result replayed in exactly what it declared."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.distro_wire import (
    FLAG_REPLAY_SETTINGS,
    ResultDecodeError,
    ResultStream,
    declared_settings,
    decode_result,
    encode_result,
    encode_varint,
)
from client_image.formats.replay_settings import ReplaySettings, encode_settings
from client_image.training.distro import compress, plan_model
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from client_image.verification.followers import (
    DECLARED_THRESHOLDS,
    THRESHOLDS,
    UNDECLARED,
    Followers,
)
from client_image.verification.settings import active, cannot_reproduce, capture
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

SHAPES = [("embed", (256, 128)), ("norm", (128,))]
PLANS = plan_model(SHAPES, 64, 8)
HEADER = {"step": 7, "trainer_nonce": 3, "batch_start": 40, "batch_end": 47}
DECLARED = ReplaySettings(compute="bf16", device="cpu", attention="math", onednn=True,
                          micro_batch=2, threads=3, torch_version="2.13.0+cpu",
                          hardware="AVX512 onednn-bf16")
FIXED = 30  # distro_wire's fixed header: the settings section starts here


def _sparse():
    torch.manual_seed(0)
    return compress([torch.randn(s) for _, s in SHAPES], PLANS)


def _payload(declared=DECLARED, one_bit=True):
    return encode_result(_sparse(), PLANS, one_bit=one_bit, settings=declared, **HEADER)


@pytest.mark.parametrize("one_bit", [True, False])
def test_declared_settings_round_trip_and_an_undeclared_result_keeps_its_bytes(one_bit):
    plain = _payload(None, one_bit)
    declared = _payload(DECLARED, one_bit)
    section = encode_settings(DECLARED)
    # The section sits between the fixed header and the tensors; nothing else moves.
    assert declared == plain[:5] + bytes([plain[5] | FLAG_REPLAY_SETTINGS]) + plain[6:FIXED] \
        + section + plain[FIXED:]
    result = decode_result(declared, PLANS)
    assert result.settings == DECLARED
    assert decode_result(plain, PLANS).settings is None
    for a, b in zip(result.tensors, decode_result(plain, PLANS).tensors, strict=True):
        assert torch.equal(a.idx, b.idx) and torch.equal(a.val, b.val)
    assert ResultStream(declared, PLANS).settings == DECLARED
    assert declared_settings(declared, PLANS) == DECLARED
    assert declared_settings(plain, PLANS) is None
    assert declared_settings(b"junk", PLANS) is None


def _with_section(body: bytes, length: int | None = None) -> bytes:
    plain = _payload(None)
    size = encode_varint(len(body) if length is None else length)
    return (plain[:5] + bytes([plain[5] | FLAG_REPLAY_SETTINGS]) + plain[6:FIXED]
            + size + body + plain[FIXED:])


GOOD_BODY = encode_settings(DECLARED)[1:]


@pytest.mark.parametrize(("data", "match"), [
    (_with_section(b""), "0 bytes, at least 8"),
    (_with_section(bytes([2]) + GOOD_BODY[1:]), "unknown compute code 2"),
    (_with_section(GOOD_BODY[:1] + bytes([9]) + GOOD_BODY[2:]), "unknown device code 9"),
    (_with_section(GOOD_BODY[:2] + bytes([5]) + GOOD_BODY[3:]), "unknown attention code 5"),
    (_with_section(GOOD_BODY[:3] + bytes([2]) + GOOD_BODY[4:]), "onednn byte 2"),
    (_with_section(GOOD_BODY[:4] + bytes([0]) + GOOD_BODY[5:]), "micro_batch 0 < 1"),
    (_with_section(GOOD_BODY[:4] + bytes([0x82, 0x00]) + GOOD_BODY[5:]), "over-long varint"),
    (_with_section(GOOD_BODY + b"x"), "1 bytes after the hardware"),
    (_with_section(GOOD_BODY[:-1] + b"\xff"), "not ASCII"),
    (_with_section(GOOD_BODY[:-1] + b"\n"), "printable"),
    (_with_section(GOOD_BODY[:6] + bytes([40]) + GOOD_BODY[7:]), "torch version of 40 bytes"),
    (_with_section(GOOD_BODY, length=5000), "at most"),
    (_with_section(GOOD_BODY, length=len(GOOD_BODY) + 3), "3 bytes after the hardware"),
    (_payload(None)[:5] + bytes([FLAG_REPLAY_SETTINGS | 1]) + _payload(None)[6:FIXED],
     "truncated: replay settings length"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_a_malformed_settings_section_is_refused_by_name(data, match):
    with pytest.raises(ResultDecodeError, match=match):
        decode_result(data, PLANS)
    with pytest.raises(ResultDecodeError):
        ResultStream(data, PLANS)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=FIXED, max_value=FIXED + len(encode_settings(DECLARED)) - 1),
       st.integers(min_value=0, max_value=255))
def test_any_byte_of_the_section_changed_decodes_or_is_refused_never_crashes(position, byte):
    data = bytearray(_payload())
    data[position] = byte
    try:
        result = decode_result(bytes(data), PLANS)
    except ResultDecodeError:
        return
    assert isinstance(result.settings, ReplaySettings)


def test_settings_are_validated_when_built_and_describe_their_differences():
    with pytest.raises(ValueError, match="attention 'fast'"):
        dataclasses.replace(DECLARED, attention="fast")
    with pytest.raises(ValueError, match="torch_version"):
        dataclasses.replace(DECLARED, torch_version="")
    other = dataclasses.replace(DECLARED, micro_batch=1, threads=2)
    assert DECLARED.differences(other) == ["micro_batch 2 -> 1", "threads 3 -> 2"]
    assert "bf16 cpu 3 threads micro-batch 2 attention math" in DECLARED.describe()


def test_a_follower_says_which_declarations_it_cannot_replay_in():
    here = capture("bf16", 2, "cpu")
    assert cannot_reproduce(here, "cpu") is None
    assert "device cuda" in cannot_reproduce(dataclasses.replace(here, device="cuda",
                                                                 threads=0), "cpu")
    assert "CUDA-only" in cannot_reproduce(dataclasses.replace(here, attention="efficient"),
                                           "cpu")
    assert "torch 0.1" in cannot_reproduce(dataclasses.replace(here, torch_version="0.1"),
                                           "cpu")
    assert "hardware AVX2" in cannot_reproduce(dataclasses.replace(here, hardware="AVX2"), "cpu")
    threads, onednn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    with active(dataclasses.replace(here, threads=1, onednn=not onednn)):
        assert torch.get_num_threads() == 1
        assert torch.backends.mkldnn.enabled == (not onednn)
    assert (torch.get_num_threads(), torch.backends.mkldnn.enabled) == (threads, onednn)


def test_a_trainer_cannot_declare_what_it_does_not_run():
    model = load_causal_lm(TINY_MODEL, device="cpu")
    with pytest.raises(ValueError, match="declared"):
        DistroTrainer(model, OPTIMIZER, SCHEDULE, micro_batch_size=1,
                      declared=capture("fp32", 2, "cpu"))


OPTIMIZER = DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                            quantize_1bit=False, clip_grad_norm=1.0, weight_decay=0.1)
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-4, warmup_steps=2)
TRAINER = b"\x07" * 32


def _follow(declared: ReplaySettings | None, known: dict[bytes, ReplaySettings],
            micro: int) -> list[str]:
    """Two steps of a trainer (micro-batch `micro`) followed by a bf16 follower whose own
    micro-batch is 2: how each result was replayed."""
    data = LocalDataProvider(TRAIN_DATA, 32)
    trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                            micro_batch_size=micro, compute="bf16", declared=declared)
    model = load_causal_lm(TINY_MODEL, device="cpu")
    own = DistroTrainer(model, OPTIMIZER, SCHEDULE, micro_batch_size=2)  # its weight decay
    followers = Followers(lambda start, s: DistroTrainer(
        model, OPTIMIZER, SCHEDULE, micro_batch_size=s.micro_batch, compute="bf16",
        start_step=start, declared=s), capture("bf16", 2, "cpu", threads=1), known=known)
    followers.follow([TRAINER], start_step=0)
    seen = []
    for step in range(2):
        rows = (4 * step, 4 * step + 1)
        followers.replay(TRAINER, step, data.get_samples(*rows), rows, cold_start=False)
        with active(declared or capture("bf16", micro, "cpu", threads=1)):
            out = trainer.train(step, data.get_samples(*rows), batch_id=rows)
        checked = followers.verify(TRAINER, step, out.payload)
        assert checked is not None
        if checked.replayed == "undeclared":  # failed whatever its distances: a report
            assert not checked.verdict.ok and checked.verdict.reason == UNDECLARED
            assert checked.judged_loosely == 0
            seen.append(checked.replayed)
            own.idle(step)
            continue
        limits = (DECLARED_THRESHOLDS if checked.replayed == "declared" else THRESHOLDS)["bf16"]
        assert checked.verdict.ok == (checked.verdict.distances.jaccard <= limits.jaccard
                                      and checked.verdict.distances.hamming <= limits.hamming
                                      and checked.verdict.distances.manhattan
                                      <= limits.manhattan)
        if checked.replayed == "declared":
            assert checked.verdict.distances.jaccard == 0.0
            assert checked.judged_loosely == 0
        else:  # the epoch's loose verdicts of this trainer so far, this one included
            assert checked.judged_loosely == step + 1
        seen.append(checked.replayed)
        own.idle(step)
    return seen


def test_a_follower_replays_in_the_declared_settings_once_it_knows_them():
    declared = capture("bf16", 1, "cpu", threads=1)
    known: dict[bytes, ReplaySettings] = {}
    # Not known yet: the shadow replays in the follower's own micro-batch 2, and says so.
    first = _follow(declared, known, micro=1)
    assert all(r.startswith("not replayed in the declared settings") and "micro_batch 2 -> 1"
               in r for r in first), first
    assert known[TRAINER] == declared  # learned from the results
    assert _follow(declared, known, micro=1) == ["declared", "declared"]
    assert _follow(None, {}, micro=2) == ["undeclared", "undeclared"]
    cuda = dataclasses.replace(declared, device="cuda", threads=0)
    assert all(r.startswith("cannot replay the declared settings: declared device cuda")
               for r in _follow(cuda, {}, micro=1))
