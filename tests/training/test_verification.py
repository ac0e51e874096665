"""Verification of peers' results (client_image/verification): Psyche's distances on
sparse results, the cheap checks, and replay verification on the real tiny model."""

import pytest
import torch
from training_assets import TINY_MODEL, TRAIN_DATA

from client_image.formats.blocks import SparseResult
from client_image.formats.distro_wire import DistroResult, encode_result
from client_image.training.model import load_causal_lm
from client_image.training.trainer import DistroTrainer
from client_image.verification import ReplayVerifier, Thresholds, cheap_checks, similarity
from client_image.verification.replay import judge
from client_image.verification.similarity import Distances
from coordinator.config import ConstantLR, DistroOptimizer
from psyche_common.token_files.local import LocalDataProvider

OPTIMIZER = DistroOptimizer(compression_decay=0.999, compression_topk=8, compression_chunk=64,
                            quantize_1bit=False, clip_grad_norm=1.0, weight_decay=0.1)
SCHEDULE = ConstantLR(base_lr=1e-3, warmup_init_lr=1e-4, warmup_steps=2)


def _result(idx: list[list[int]], val: list[list[float]]) -> SparseResult:
    return SparseResult(torch.tensor(idx), torch.tensor(val))


def test_distances_follow_their_definitions():
    a = [_result([[0, 1, 2, 3]], [[1.0, -1.0, 2.0, 0.5]])]
    b = [_result([[0, 1, 4, 5]], [[1.0, 1.0, 3.0, 0.5]])]
    d = similarity(a, b, [16]).overall
    assert d.jaccard == pytest.approx(1 - 2 / 6)  # {0,1} shared of {0..5}
    assert d.hamming == pytest.approx(1 / 2)  # index 1 disagrees in sign, index 0 agrees
    # |A - B| = 0 + 2 + 2 + 0.5 + 3 + 0.5 = 8 over |B| = 5.5
    assert d.manhattan == pytest.approx(8 / 5.5)
    assert similarity(a, a, [16]).overall == Distances(0.0, 0.0, 0.0)
    # two empty results agree; an empty one against a full one shares nothing
    empty = [_result([[0, 0, 0, 0]], [[0.0, 0.0, 0.0, 0.0]])]
    assert similarity(empty, empty, [16]).overall == Distances(0.0, 0.0, 0.0)
    assert similarity(empty, b, [16]).overall.hamming == 1.0
    with pytest.raises(ValueError, match="parameters"):
        similarity(a, a + a, [16])


def test_thresholds_keep_a_margin_over_honest_noise_and_judge_names_the_metric():
    honest = [Distances(0.0, 0.0, 0.0), Distances(0.01, 0.002, 0.03)]
    limits = Thresholds.from_honest(honest, margin=3.0, floor=0.02)
    assert limits == Thresholds(jaccard=0.03, hamming=0.02, manhattan=pytest.approx(0.09))
    verdict = judge(Distances(0.5, 0.0, 0.0), limits)
    assert not verdict.ok and verdict.reason.startswith("jaccard 0.5000 > 0.0300")
    assert judge(Distances(0.01, 0.01, 0.01), limits).ok


def _decoded(trainer: DistroTrainer, tensors: list[SparseResult], step: int) -> DistroResult:
    return trainer.decode(encode_result(tensors, trainer.plans, step=step, trainer_nonce=0,
                                        batch_start=0, batch_end=1, one_bit=False))


def test_replay_reproduces_an_honest_trainer_and_catches_a_wrong_batch():
    data = LocalDataProvider(TRAIN_DATA, 32)
    honest = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                           micro_batch_size=2)
    cheat = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                          micro_batch_size=2)
    verifier_model = load_causal_lm(TINY_MODEL, device="cpu")
    # The verifier's own trainer: the step's weight decay reaches its weights as every
    # client's (here by idling; a verifier that trains gets it from its own train()).
    own = DistroTrainer(verifier_model, OPTIMIZER, SCHEDULE, micro_batch_size=2)
    follow_honest = ReplayVerifier(DistroTrainer(verifier_model, OPTIMIZER, SCHEDULE,
                                                 micro_batch_size=2))
    follow_cheat = ReplayVerifier(DistroTrainer(verifier_model, OPTIMIZER, SCHEDULE,
                                                micro_batch_size=2))
    limits = Thresholds.from_honest([])
    for step in range(3):
        assigned = data.get_samples(4 * step, 4 * step + 1)
        expected_honest = follow_honest.expected(step, assigned, (4 * step, 4 * step + 1))
        expected_cheat = follow_cheat.expected(step, assigned, (4 * step, 4 * step + 1))
        out = honest.train(step, assigned)
        wrong = cheat.train(step, data.get_samples(900 + 4 * step, 901 + 4 * step))
        assert out.payload is not None and wrong.payload is not None
        verdict = follow_honest.verify(honest.decode(out.payload), expected_honest, limits)
        assert verdict.ok and verdict.distances == Distances(0.0, 0.0, 0.0), verdict
        caught = follow_cheat.verify(cheat.decode(wrong.payload), expected_cheat, limits)
        assert not caught.ok and "jaccard" in caught.reason, caught
        own.idle(step)
        # The shadows did not move the verifier's weights: they equal the honest trainer's.
        for ours, theirs in zip(own.params, honest.params, strict=True):
            assert torch.equal(ours, theirs)


def test_cheap_checks_catch_empty_copied_and_repeated_results():
    trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                            micro_batch_size=2)
    data = LocalDataProvider(TRAIN_DATA, 32)
    first = trainer.decode(trainer.train(1, data.get_samples(0, 1)).payload or b"")
    second = trainer.decode(trainer.train(2, data.get_samples(2, 3)).payload or b"")
    plans = trainer.plans
    lr = trainer.learning_rate(2)
    assert cheap_checks(second, plans, others={}, previous=first, learning_rate=lr) == []
    copy = _decoded(trainer, list(second.tensors), 2)
    assert [c.name for c in cheap_checks(copy, plans, others={"peer": second}, previous=first,
                                          learning_rate=lr)] == ["copy"]
    assert [c.name for c in cheap_checks(copy, plans, others={}, previous=second,
                                          learning_rate=lr)] == ["repeat"]
    zeros = _decoded(trainer, [SparseResult(torch.zeros_like(t.idx), torch.zeros_like(t.val))
                               for t in second.tensors], 2)
    assert [c.name for c in cheap_checks(zeros, plans, others={}, previous=None,
                                          learning_rate=lr)] == ["empty"]
    # At a learning rate of 0 an empty result is the honest one; anything else is not.
    assert cheap_checks(zeros, plans, others={}, previous=None, learning_rate=0.0) == []
    assert [c.name for c in cheap_checks(second, plans, others={}, previous=None,
                                          learning_rate=0.0)] == ["not_empty"]


def test_a_copier_ahead_of_its_original_does_not_keep_its_copy():
    """The issue-36 order: a copier whose batch position is earlier than its original's
    was kept and the honest original left out. Both go now, in either order, and an
    honest third result stays."""
    from client_image.verification.checks import screen

    trainer = DistroTrainer(load_causal_lm(TINY_MODEL, device="cpu"), OPTIMIZER, SCHEDULE,
                            micro_batch_size=2)
    data = LocalDataProvider(TRAIN_DATA, 32)
    original = trainer.decode(trainer.train(2, data.get_samples(0, 1)).payload or b"")
    other = trainer.decode(trainer.train(3, data.get_samples(2, 3)).payload or b"")
    copy = _decoded(trainer, list(original.tensors), 2)
    lr = trainer.learning_rate(2)
    ahead = screen([("copier", copy), ("honest", original), ("third", other)],
                   trainer.plans, {}, lr)
    behind = screen([("honest", original), ("copier", copy), ("third", other)],
                    trainer.plans, {}, lr)
    assert {i: c.name for i, c in ahead.items()} == {0: "copy", 1: "copy"}
    assert {i: c.name for i, c in behind.items()} == {0: "copy", 1: "copy"}
    assert "honest (position 1)" in ahead[0].detail
    # without a copy, nothing honest is left out
    assert screen([("honest", original), ("third", other)], trainer.plans, {}, lr) == {}


async def test_the_workers_screen_leaves_out_copies_empties_and_repeats():
    import tomllib
    from pathlib import Path

    from client_image.runtime.worker import TrainingWorker
    from coordinator.config import state_file_from_dict

    state = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
    llm = state_file_from_dict(tomllib.loads(state.read_text())).model
    worker = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32")
    try:
        await worker.load_from_hub(str(TINY_MODEL), None, llm, start_step=0)
        data = LocalDataProvider(TRAIN_DATA, 32)
        trainer = worker.trainer
        assert trainer is not None
        a = (await worker.train(5, data.get_samples(0, 1), (0, 1), False)).payload
        b = (await worker.train(6, data.get_samples(2, 3), (2, 3), False)).payload
        assert a is not None and b is not None
        decoded = trainer.decode(b)
        copy = encode_result(list(decoded.tensors), trainer.plans, step=6, trainer_nonce=99,
                             batch_start=4, batch_end=5, one_bit=decoded.one_bit)
        zeros = encode_result([SparseResult(torch.zeros_like(t.idx), torch.zeros_like(t.val))
                               for t in decoded.tensors], trainer.plans, step=6,
                              trainer_nonce=1, batch_start=6, batch_end=7,
                              one_bit=decoded.one_bit)
        honest, copier, lazy, replayer = b"h" * 32, b"c" * 32, b"z" * 32, b"r" * 32
        replay = encode_result(list(trainer.decode(a).tensors), trainer.plans, step=6,
                               trainer_nonce=2, batch_start=8, batch_end=9,
                               one_bit=decoded.one_bit)
        left_out = await worker.screen(
            6, [(honest, b), (copier, copy), (lazy, zeros), (replayer, replay)],
            {replayer: a, honest: a})
        # the copy and its original both: content cannot tell which came first
        assert {i: check for i, (check, _) in left_out.items()} == {
            0: "copy", 1: "copy", 2: "empty", 3: "repeat"}
        # the same inputs, the same answer: what keeps every client's weights identical
        assert left_out == await worker.screen(
            6, [(honest, b), (copier, copy), (lazy, zeros), (replayer, replay)],
            {replayer: a, honest: a})
        # bytes that are no result are left out by name; a garbage previous one is ignored
        garbler = b"g" * 32
        left_out = await worker.screen(6, [(garbler, b"not a result"), (honest, b)],
                                       {garbler: b"junk", honest: a})
        assert list(left_out) == [0] and left_out[0][0] == "undecodable", left_out
    finally:
        worker.close()


async def test_the_worker_screens_downloads_by_their_fingerprints_without_decoding_again(
        monkeypatch):
    import tomllib
    from pathlib import Path

    from client_image.runtime.worker import TrainingWorker
    from coordinator.config import state_file_from_dict

    state = Path(__file__).resolve().parents[2] / "config" / "local-testnet" / "state.toml"
    llm = state_file_from_dict(tomllib.loads(state.read_text())).model
    worker = TrainingWorker(device="cpu", micro_batch_size=2, dtype="fp32")
    try:
        await worker.load_from_hub(str(TINY_MODEL), None, llm, start_step=0)
        data = LocalDataProvider(TRAIN_DATA, 32)
        old = (await worker.train(5, data.get_samples(0, 1), (0, 1), False)).payload
        new = (await worker.train(7, data.get_samples(2, 3), (2, 3), False)).payload
        assert old is not None and new is not None
        for payload in (old, new):
            kept = await worker.decode(payload)  # what a download does
            assert 0 < kept.fill <= 1 and kept.sketch.dtype == torch.int32
        trainer = worker.trainer
        assert trainer is not None
        decodes = []
        real_decode = trainer.decode
        monkeypatch.setattr(trainer, "decode", lambda p, *a: decodes.append(p) or real_decode(p))
        assert await worker.screen(7, [(b"n" * 32, new)], {}) == {}
        assert decodes == []  # read from the fingerprint kept at download
        assert len(worker._fingerprints) == 1  # step 5's is no longer needed
        assert await worker.screen(7, [(b"n" * 32, new)], {b"n" * 32: old}) == {}
        assert decodes == [old]  # a dropped one is decoded again when it is asked for
    finally:
        worker.close()
