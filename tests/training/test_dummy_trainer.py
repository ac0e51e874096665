"""The Dummy optimizer's trainer (client_image/training/dummy_trainer.py) in the client's
worker: a step sleeps --dummy-training-delay-secs instead of training, its 30-byte result
decodes on every peer, passes the cheap checks and applies as no update; garbage does not
decode, and no other optimizer's payload passes for a Dummy one (nor the reverse)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from client_image.runtime.worker import TrainingWorker
from client_image.training import DistroTrainer, ResultDecodeError
from client_image.training.defaults import DISTRO_PSYCHE
from client_image.training.dummy_model import dummy_causal_lm
from client_image.training.dummy_trainer import (
    DUMMY_RESULT_SIZE,
    DummyTrainer,
    decode_dummy_result,
    encode_dummy_result,
)
from coordinator.config import DummyCheckpoint, DummyOptimizer, LLMConfig, load_state_file

ROOT = Path(__file__).resolve().parents[2]


def dummy_llm() -> LLMConfig:
    state = load_state_file(ROOT / "config" / "local-testnet" / "state.toml")
    return state.model.model_copy(update={"checkpoint": DummyCheckpoint(repo_id=""),
                                          "optimizer": DummyOptimizer()})


def weights(worker: TrainingWorker) -> dict[str, torch.Tensor]:
    assert worker.model is not None
    return {k: v.detach().clone() for k, v in worker.model.state_dict().items()}


def test_a_result_round_trips_and_is_tiny() -> None:
    payload = encode_dummy_result(7, 3, 40, 44)
    assert len(payload) == DUMMY_RESULT_SIZE == 30
    result = decode_dummy_result(payload)
    assert (result.step, result.trainer_nonce, result.batch_start, result.batch_end) == (
        7, 3, 40, 44)
    assert result.tensors == []


@pytest.mark.parametrize(("payload", "message"), [
    (encode_dummy_result(1, 0, 0, 4)[:-1], "a Dummy result is 30 bytes, got 29"),
    (encode_dummy_result(1, 0, 0, 4) + b"\0", "a Dummy result is 30 bytes, got 31"),
    (b"PSDR" + encode_dummy_result(1, 0, 0, 4)[4:], "bad magic b'PSDR', expected b'PSDY'"),
    (encode_dummy_result(1, 0, 0, 4)[:4] + b"\x02\x00" + encode_dummy_result(1, 0, 0, 4)[6:],
     "Dummy result version 2, expected 1"),
    (encode_dummy_result(1, 0, 9, 4), "Dummy result batch 9..4 is reversed"),
    (bytes(30), "bad magic"),
])
def test_garbage_does_not_decode(payload: bytes, message: str) -> None:
    with pytest.raises(ResultDecodeError, match=re.escape(message)):
        DummyTrainer().decode(payload)


def test_a_step_sleeps_the_delay_and_trains_nothing() -> None:
    trainer = DummyTrainer(delay_s=0.3)
    started = time.monotonic()
    out = trainer.train(5, torch.zeros(2, 8, dtype=torch.long), batch_id=(10, 12))
    assert time.monotonic() - started >= 0.3
    assert (out.step, out.loss, out.grad_norm) == (5, 0.0, 0.0)
    assert out.payload is not None and trainer.decode(out.payload, expected_step=5).batch_end == 12
    with pytest.raises(ResultDecodeError, match="payload is for step 5, expected 6"):
        trainer.decode(out.payload, expected_step=6)
    with pytest.raises(ValueError, match="delay_s must be >= 0"):
        DummyTrainer(delay_s=-1)


async def test_results_are_shared_screened_and_applied_as_no_update() -> None:
    llm = dummy_llm()
    workers = [TrainingWorker(device="cpu", dtype="fp32", dummy_training_delay_s=0.05)
               for _ in range(2)]
    try:
        for worker in workers:
            await worker.load_dummy("", llm, start_step=0)
        assert isinstance(workers[0].trainer, DummyTrainer)
        before = weights(workers[0])
        batch = torch.randint(0, 256, (2, 16))
        outs = [await worker.train(3, batch, (2 * i, 2 * i + 2), False)
                for i, worker in enumerate(workers)]
        payloads = [out.payload for out in outs]
        assert all(p is not None and len(p) == DUMMY_RESULT_SIZE for p in payloads)
        results = [(bytes([i]) * 32, p) for i, p in enumerate(payloads) if p is not None]
        for worker in workers:
            for _, payload in results:
                assert (await worker.decode(payload)).step == 3  # the download's check
            assert await worker.screen(3, results, {}) == {}  # cheap checks: all kept
            assert await worker.apply(5, [p for _, p in results]) == 2
            assert await worker.apply(6, [p for _, p in results]) == 0  # not step 4's
        after = weights(workers[0])
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert all(torch.equal(after[k], weights(workers[1])[k]) for k in after)
        with pytest.raises(ResultDecodeError):
            await workers[0].decode(b"\xff" * DUMMY_RESULT_SIZE)
    finally:
        for worker in workers:
            worker.close()


def test_a_distro_payload_is_not_a_dummy_result_nor_the_reverse() -> None:
    from coordinator.config import ConstantLR

    model = dummy_causal_lm("")
    distro = DistroTrainer(model, DISTRO_PSYCHE,
                           ConstantLR(base_lr=1e-3, warmup_init_lr=0.0, warmup_steps=0),
                           micro_batch_size=1)
    out = distro.train(0, torch.randint(0, 256, (1, 16)), batch_id=(0, 1))
    assert out.payload is not None
    with pytest.raises(ResultDecodeError):
        DummyTrainer().decode(out.payload)
    with pytest.raises(ResultDecodeError):
        distro.decode(encode_dummy_result(0, 0, 0, 1))


def test_a_negative_delay_is_a_usage_error() -> None:
    from typer.testing import CliRunner

    from client_image.cli import app

    result = CliRunner().invoke(app, ["train", "--run-id", "r", "--server-addr", "127.0.0.1:9",
                                      "--logs", "none", "--dummy-training-delay-secs", "-1"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert ("'--dummy-training-delay-secs' (env var: 'DUMMY_TRAINING_DELAY_SECS'): Input "
            "should be greater than or equal to 0") in result.output
    assert "Traceback" not in result.output


async def test_the_delay_of_a_run_that_learns_is_ignored_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    learning = dummy_llm().model_copy(update={"optimizer": DISTRO_PSYCHE})
    worker = TrainingWorker(device="cpu", dtype="fp32", dummy_training_delay_s=2.0)
    try:
        with caplog.at_level("WARNING", logger="client_image.runtime.worker"):
            await worker.load_dummy("", learning, start_step=0)
        assert isinstance(worker.trainer, DistroTrainer)
        assert ("--dummy-training-delay-secs applies to runs of the Dummy optimizer only; "
                "this run's is Distro: ignored") in caplog.text
    finally:
        worker.close()
