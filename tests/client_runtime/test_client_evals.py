"""The client's evals: its flags, when they run (between epochs, never inside a round:
the in-memory swarm of runner_swarm.py with the real tiny Llama to score), and where the
scores show (events, the local metrics, psyche_eval_metrics, the TUI's training panel)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from runner_swarm import FakeSwarm
from textual.widgets import Static
from typer.testing import CliRunner

from client_image.cli import app
from client_image.runtime.evaluating import MODEL_BUSY, EvalOptions, IdleEvals
from client_image.runtime.events import (
    EvalFailed,
    EvalScored,
    EvalsInterrupted,
    PromptSampled,
    RuntimeEvent,
)
from client_image.runtime.observability import Counters, EventLog, snapshot
from client_image.runtime.tui import ClientApp
from client_image.runtime.worker import TrainingWorker, WorkerError
from client_image.telemetry import ClientTelemetry
from client_image.training.model import load_causal_lm
from coordinator import RunState
from psyche_common.metrics_schema import ClientMetrics
from psyche_common.telemetry import ServiceIdentity, Telemetry, TelemetryOptions
from psyche_common.ui.view import describe_training
from tests.client_runtime.standin_client import StandInClient

T = TypeVar("T")
TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "tiny-llama"
BASE = ["train", "--run-id", "r", "--server-addr", "127.0.0.1:9", "--logs", "none"]
KNOWN = ("use arc_challenge, arc_easy, boolq, ceval_valid, hellaswag, mmlu, mmlu_cf, "
         "mmlu_pro, openbookqa, piqa")


# ------------------------------------------------------------------ flags
@pytest.mark.parametrize(("args", "env", "message"), [
    (["--eval-tasks", "arc_easy,squad"], {}, f"unknown eval task 'squad': {KNOWN}"),
    ([], {"EVAL_TASKS": "hellaswag,lambada"}, f"unknown eval task 'lambada': {KNOWN}"),
    (["--eval-task-max-docs", "0"], {}, "Input should be greater than or equal to 1"),
    (["--eval-data-dir", "/nonexistent/evals"], {}, "/nonexistent/evals is not a directory"),
])
def test_a_bad_eval_flag_is_a_one_line_usage_error(args: list[str], env: dict[str, str],
                                                    message: str) -> None:
    result = CliRunner().invoke(app, [*BASE, *args], env={"COLUMNS": "200", **env})
    assert result.exit_code == 2, result.output
    assert any(message in line for line in result.output.splitlines()), result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ when they run
class TinyModelAccess:
    """The worker's `on_model` over the real tiny Llama (one call at a time, in a thread,
    as the worker's lock runs them), recording the coordinator's phase when each call got
    the model and when it gave it back. With a `gate`, a call keeps the model after its
    work until the gate opens."""

    def __init__(self, swarm: FakeSwarm):
        self.swarm = swarm
        self.model = load_causal_lm(TINY_MODEL, device="cpu")
        self.lock = asyncio.Lock()
        self.calls: list[tuple[RunState, RunState]] = []
        self.gate: threading.Event | None = None
        self.in_hand = threading.Event()  # a gated call did its work and waits

    async def on_model(self, fn: Callable[[torch.nn.Module, Path | None], T]) -> T:
        gate = self.gate

        def call() -> T:
            result = fn(self.model, TINY_MODEL)
            if gate is not None:  # a slow document: the model stays in hand
                self.in_hand.set()
                gate.wait(60)
            return result
        async with self.lock:
            got = self.swarm.coordinator.state.run_state
            result = await asyncio.to_thread(call)
            self.calls.append((got, self.swarm.coordinator.state.run_state))
            return result


def with_evals(swarm: FakeSwarm, options: EvalOptions) -> TinyModelAccess:
    access = TinyModelAccess(swarm)
    for runner in swarm.runners:
        runner.idle = IdleEvals(options, access, runner.events)
    return access


def evals_of(runner: Any) -> IdleEvals:
    assert isinstance(runner.idle, IdleEvals)
    return runner.idle


async def idle_evals_end(swarm: FakeSwarm) -> None:
    for runner in swarm.runners:
        task = evals_of(runner).task
        assert task is not None, "no evals started"
        await asyncio.wait_for(task, 120)


def cooldown_of(epoch: int) -> Callable[[FakeSwarm], bool]:
    return lambda s: (s.coordinator.state.run_state is RunState.Cooldown
                      and s.coordinator.state.progress.epoch == epoch)


async def test_evals_score_the_model_after_the_cooldown_checkpoint_never_in_a_round() -> None:
    swarm = FakeSwarm(2, epoch_time=12, warmup_time=5, max_round_train_time=5)
    access = with_evals(swarm, EvalOptions(tasks=("arc_easy", "boolq"), max_docs=3,
                                           prompt_task=True))
    await swarm.run_until(cooldown_of(0))
    # Nothing before the cooldown (on a fast run the first documents may already be in
    # hand, after the cooldown's checkpoint: each call records its phases).
    assert all(phases == (RunState.Cooldown, RunState.Cooldown) for phases in access.calls)
    await swarm.settle()  # the checkpoint is written and shared: the model is free
    await idle_evals_end(swarm)
    step = swarm.coordinator.state.progress.step - 1  # the checkpoint's
    for who in swarm.nodes:
        scored = {e.task: e for e in swarm.events_of(EvalScored, who)}
        assert set(scored) == {"arc_easy", "boolq"}
        assert all((e.epoch, e.step, e.docs, e.source) == (0, step, 3, "bundled sample")
                   for e in scored.values())
        assert round(scored["arc_easy"].acc * 3, 3) in (0, 1, 2, 3)  # a mean over 3 docs
        assert scored["arc_easy"].acc_norm is not None and scored["boolq"].acc_norm is None
        [prompt] = swarm.events_of(PromptSampled, who)
        assert prompt.epoch == 0 and prompt.completion
    # 2 runners x (the tokenizer, the prompt, 3 + 3 documents), all in the cooldown
    assert access.calls == [(RunState.Cooldown, RunState.Cooldown)] * 16
    # The next epoch's rounds run with no eval; its cooldown evaluates its model.
    await swarm.run_until(lambda s: s.coordinator.state.progress.epoch == 1
                          and s.coordinator.state.progress.step >= step + 3)
    assert len(access.calls) == 16
    await swarm.run_until(cooldown_of(1))
    await swarm.settle()
    await idle_evals_end(swarm)
    assert sorted(e.epoch for e in swarm.events_of(EvalScored)) == [0] * 4 + [1] * 4
    assert access.calls == [(RunState.Cooldown, RunState.Cooldown)] * 32
    assert not swarm.events_of(EvalFailed) and not swarm.events_of(EvalsInterrupted)


async def test_a_warm_up_stops_the_evals_after_the_document_in_hand() -> None:
    swarm = FakeSwarm(2, epoch_time=12, warmup_time=5, max_round_train_time=5)
    access = with_evals(swarm, EvalOptions(tasks=("hellaswag",)))
    access.gate = threading.Event()  # the first document keeps the model until we say
    await swarm.run_until(cooldown_of(0))
    await swarm.settle()
    assert await asyncio.to_thread(access.in_hand.wait, 60)
    await swarm.run_until(lambda s: s.coordinator.state.run_state in MODEL_BUSY)
    access.gate.set()
    await idle_evals_end(swarm)
    # Only the document in hand when the warm-up came was scored: the other runner's
    # call, queued behind it, found the evals stopped and gave the model back at once.
    assert access.calls == [(RunState.Cooldown, swarm.coordinator.state.run_state)]
    assert len(swarm.events_of(EvalsInterrupted)) == 2 and not swarm.events_of(EvalScored)
    # Cut short, the task starts again at the next idle time (a score is of one model).
    access.gate = None
    await swarm.run_until(cooldown_of(1))
    await swarm.settle()
    await idle_evals_end(swarm)
    assert [(e.epoch, e.docs) for e in swarm.events_of(EvalScored)] == [(1, 4), (1, 4)]
    assert all(got not in MODEL_BUSY for got, _ in access.calls)


async def test_the_training_worker_lends_its_model_between_calls() -> None:
    worker = TrainingWorker(device="cpu")
    events = EventLog("none")
    seen: list[RuntimeEvent] = []
    events.listeners.append(seen.append)
    with pytest.raises(WorkerError, match="no model is loaded"):
        await worker.on_model(lambda model, directory: None)
    worker.model, worker.model_dir = load_causal_lm(TINY_MODEL, device="cpu"), TINY_MODEL
    assert await worker.on_model(lambda model, directory: (model is worker.model, directory)
                                 ) == (True, TINY_MODEL)
    evals = IdleEvals(EvalOptions(tasks=("piqa",), max_docs=2), worker, events)
    state = FakeSwarm(1).coordinator.state
    evals.model_free(state)
    await evals.close()  # a stopping client: no document is scored
    assert seen == [EvalsInterrupted(epoch=0, reason="the model went back to training "
                                                     "(before the first document)")]
    evals = IdleEvals(EvalOptions(tasks=("piqa",), max_docs=2), worker, events)
    evals.model_free(state)
    assert evals.task is not None
    await evals.task
    [scored] = [e for e in seen if isinstance(e, EvalScored)]
    assert (scored.task, scored.docs, scored.source) == ("piqa", 2, "bundled sample")
    assert worker.model.training  # put back
    worker.model_dir = None
    cast(Any, worker.model).name_or_path = "/nowhere"  # and not where transformers read it
    evals = IdleEvals(EvalOptions(tasks=("piqa",)), worker, events)
    evals.model_free(state)
    assert evals.task is not None
    await evals.task
    assert seen[-1] == EvalFailed(task="*", error="no tokenizer.json beside the model: "
                                                  "evals need the run's tokenizer")
    worker.close()


# ------------------------------------------------------------------ where they show
SCORED = (EvalScored(task="arc_easy", epoch=1, step=9, docs=4, acc=0.5, acc_norm=0.25,
                     source="bundled sample", seconds=0.1),
          EvalScored(task="boolq", epoch=1, step=9, docs=4, acc=0.75, acc_norm=None,
                     source="bundled sample", seconds=0.1))


def test_the_local_metrics_and_the_training_lines_carry_the_last_scores() -> None:
    counters = Counters()
    for event in SCORED:
        counters.observe(event)
    served = ClientMetrics.model_validate_json(snapshot(counters, "", None).model_dump_json())
    assert served.evals == {"arc_easy": {"acc": 0.5, "acc_norm": 0.25}, "boolq": {"acc": 0.75}}
    assert ClientMetrics.model_validate({"round_step": 1}).evals == {}  # an older client's
    lines = describe_training(served)
    assert lines[-3:] == ["eval      acc    acc_norm",
                          "arc_easy  0.500  0.250",
                          "boolq     0.750  —"]
    assert not any("eval" in line for line in describe_training(ClientMetrics()))


def test_psyche_eval_metrics_has_a_series_per_task_and_metric() -> None:
    client = StandInClient()
    telemetry = Telemetry.start(TelemetryOptions(prometheus_port=0),
                                ServiceIdentity("client", "a1" * 32, "run"))
    try:
        ClientTelemetry(telemetry, client)  # type: ignore[arg-type]  # a stand-in client
        for event in SCORED:
            client.events.emit(event)
        assert telemetry.prometheus is not None
        text = httpx.get(f"http://127.0.0.1:{telemetry.prometheus.port}/metrics",
                         timeout=5).text
        series = {(s.labels["task"], s.labels["metric"]): s.value
                  for family in text_string_to_metric_families(text) for s in family.samples
                  if s.name == "psyche_eval_metrics"}
        assert series == {("arc_easy", "acc"): 0.5, ("arc_easy", "acc_norm"): 0.25,
                          ("boolq", "acc"): 0.75}
    finally:
        telemetry.shutdown()


async def test_the_client_tui_shows_the_scores_in_its_training_panel() -> None:
    client = StandInClient()
    app_ = ClientApp(client, refresh_s=0.05)  # type: ignore[arg-type]  # a stand-in client
    async with app_.run_test(size=(140, 40)) as pilot:
        await pilot.pause(0.1)
        summary = app_.query_one("#training-summary", Static)
        assert "acc_norm" not in str(summary.render())
        client.events.emit(SCORED[0])
        await pilot.pause(0.15)
        assert "arc_easy  0.500  0.250" in str(summary.render())
        await pilot.press("q")
        await pilot.pause(0.1)
    assert app_.return_value == 0
