"""A client that can never train the run (its model cannot fit the GPU) stops with the
reason instead of retrying every epoch; the memory plan behind that refusal."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from runner_swarm import FakeSwarm

from client_image.runtime.events import TaskFailed
from client_image.runtime.ports import Unrunnable
from client_image.training.memory_plan import GIB, run_refusal
from coordinator.config import state_file_from_dict

REPO = Path(__file__).resolve().parents[2]
LLM = state_file_from_dict(tomllib.loads(
    (REPO / "config" / "local-testnet" / "state.toml").read_text())).model


async def test_a_model_that_cannot_fit_stops_the_client_with_the_reason() -> None:
    swarm = FakeSwarm(2)
    refusing = swarm.nodes[0]
    worker = swarm.worker(refusing)
    reason = "this run does not fit on cuda:0: needs 136 GiB per device"

    async def refuse(*_args: object, **_kwargs: object) -> None:
        raise Unrunnable(reason)

    worker.load_from_hub = refuse  # type: ignore[method-assign]  # the GPU that cannot exist here
    stopped: list[str] = []
    swarm.runner(refusing).on_unrunnable = stopped.append
    await swarm.run_until(lambda s: bool(stopped), max_turns=200)

    assert stopped == [reason]
    failures = [e for e in swarm.events_of(TaskFailed, refusing) if e.task == "warmup"]
    assert failures and failures[0].error_type == "Unrunnable"
    # The other client is not affected.
    assert not [e for who, e in swarm.events if who != refusing and isinstance(e, TaskFailed)]


def test_the_refusal_names_what_does_not_fit_and_lets_what_fits_through() -> None:
    from transformers import AutoConfig

    eight_b = AutoConfig.for_model(**json.loads(
        (REPO / "config" / "models" / "llama-8b" / "config.json").read_text()))
    one_b = AutoConfig.for_model(**json.loads(
        (REPO / "config" / "models" / "llama-1b" / "config.json").read_text()))
    refusal = run_refusal(eight_b, LLM, 80 * GIB, micro_batch_size=1, compute="bf16")
    assert refusal is not None and "80.00 GiB" in refusal
    assert run_refusal(one_b, LLM, 80 * GIB, micro_batch_size=1, compute="bf16") is None
    # Split over 8 data-parallel ranks the 8 B model fits the same GPUs.
    assert run_refusal(eight_b, LLM, 80 * GIB, dp=8, micro_batch_size=1, compute="bf16") is None
    # A tensor-parallel degree that does not divide the heads is named, not planned.
    assert "does not divide" in (run_refusal(one_b, LLM, 80 * GIB, tp=5) or "")
