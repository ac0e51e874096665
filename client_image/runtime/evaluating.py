"""Evals while the model is idle: from the cooldown's checkpoint until the next epoch needs it.

    EvalOptions                   --eval-tasks, --eval-seed, --eval-task-max-docs,
                                  --prompt-task, --eval-data-dir
    IdleEvals(options, model, events)
        on_state(state)           a warm-up or a round needs the model: stop after the
                                  document in hand
        model_free(state)         the cooldown's checkpoint is written and shared: evaluate
                                  this model (once per epoch) in the background
        close()                   stop, and wait for the document in hand
    ModelAccess                   what it needs of the worker: `on_model(fn)` runs
                                  fn(model, model_dir) in the worker thread, under its lock

Never on the training path: each document is one call under the worker's lock (FIFO: a
training call waits at most for one document's forward pass), and a warm-up or round
stops the evals between two documents. A task cut short starts again at the next idle
time, so each score is of one model, whole. The results are events (EvalScored,
PromptSampled, EvalFailed, EvalsInterrupted): the log, the metric psyche_eval_metrics and
the TUIs read them. Nothing here can fail a round: every error is an EvalFailed event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import torch
from tokenizers import Tokenizer

from client_image.evals.catalog import EvalDataError, LoadedTask, load_task
from client_image.evals.scoring import EvalDoc, accuracy, greedy_completion, score_doc
from client_image.runtime.events import EvalFailed, EvalScored, EvalsInterrupted, PromptSampled
from client_image.runtime.observability import EventLog
from coordinator import CoordinatorState, RunState

T = TypeVar("T")
log = logging.getLogger(__name__)
PROMPT = "The most important thing to know about the history of science is"
PROMPT_TOKENS = 32
# Phases in which the model belongs to the round: evals stop at once.
MODEL_BUSY = (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness)


@dataclass(frozen=True)
class EvalOptions:
    tasks: tuple[str, ...] = ()
    seed: int = 42
    max_docs: int | None = None  # per task; None: all of its documents
    prompt_task: bool = False
    data_dir: Path | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.tasks) or self.prompt_task


class ModelAccess(Protocol):
    async def on_model(self, fn: Callable[[torch.nn.Module, Path | None], T]) -> T: ...


class _Stopped(Exception):
    """A round needs the model: the evals of this idle time end here."""


class IdleEvals:
    def __init__(self, options: EvalOptions, model: ModelAccess, events: EventLog):
        self.options = options
        self.model = model
        self.events = events
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.evaluated_epoch: int | None = None  # the last epoch whose evals all ran
        self.prompted_epoch: int | None = None
        self._loaded: dict[str, LoadedTask] = {}  # documents are the same every epoch

    def on_state(self, state: CoordinatorState) -> None:
        if state.run_state in MODEL_BUSY:
            self.stopping = True

    def model_free(self, state: CoordinatorState) -> None:
        epoch = state.progress.epoch
        if (not self.options.enabled or self.evaluated_epoch == epoch
                or (self.task is not None and not self.task.done())):
            return
        self.stopping = False
        self.task = asyncio.get_running_loop().create_task(
            self._run(epoch, max(0, state.progress.step - 1)), name="evals")

    async def close(self) -> None:
        self.stopping = True
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task

    # ------------------------------------------------------------------ the evals
    async def _run(self, epoch: int, step: int) -> None:
        try:
            tokenizer = await self._call(_find_tokenizer)
            if tokenizer is None:
                self.events.emit(EvalFailed(task="*", error="no tokenizer.json beside the "
                                            "model: evals need the run's tokenizer"))
                self.evaluated_epoch = epoch
                return
            if self.options.prompt_task and self.prompted_epoch != epoch:
                text = await self._call(
                    lambda model, _: greedy_completion(model, tokenizer, PROMPT, PROMPT_TOKENS))
                self.prompted_epoch = epoch
                self.events.emit(PromptSampled(epoch=epoch, step=step, prompt=PROMPT,
                                               completion=text))
            for name in self.options.tasks:
                await self._evaluate(name, tokenizer, epoch, step)
            self.evaluated_epoch = epoch
        except _Stopped as stopped:
            self.events.emit(EvalsInterrupted(epoch=epoch, reason=str(stopped)))
        except Exception as exc:  # an eval's bug must never stop the client or its rounds
            log.debug("evals failed", exc_info=True)  # the event carries the error
            self.events.emit(EvalFailed(task="*", error=f"{type(exc).__name__}: {exc}"[:300]))

    async def _evaluate(self, name: str, tokenizer: Tokenizer, epoch: int, step: int) -> None:
        try:
            task = await self._task(name)
        except EvalDataError as exc:
            self.events.emit(EvalFailed(task=name, error=str(exc)[:300]))
            return
        started = time.monotonic()
        acc = acc_norm = 0.0
        for number, doc in enumerate(task.docs):
            lls = await self._call(_scorer(tokenizer, doc), f"{name}: document {number + 1} "
                                   f"of {len(task.docs)} was next")
            score = accuracy(doc, lls)
            acc, acc_norm = acc + score.acc, acc_norm + score.acc_norm
        count = max(1, len(task.docs))
        self.events.emit(EvalScored(
            task=name, epoch=epoch, step=step, docs=len(task.docs), acc=round(acc / count, 4),
            acc_norm=round(acc_norm / count, 4) if task.spec.acc_norm else None,
            source=task.source, seconds=round(time.monotonic() - started, 2)))

    async def _task(self, name: str) -> LoadedTask:
        if name not in self._loaded:
            options = self.options
            self._loaded[name] = await asyncio.to_thread(
                load_task, name, data_dir=options.data_dir, seed=options.seed,
                max_docs=options.max_docs)
        return self._loaded[name]

    async def _call(self, fn: Callable[[torch.nn.Module, Path | None], T],
                    where: str = "before the first document") -> T:
        reason = f"the model went back to training ({where})"
        if self.stopping:
            raise _Stopped(reason)

        def unless_stopped(model: torch.nn.Module, model_dir: Path | None) -> T:
            # Checked again when the call's turn comes: a warm-up or round that came while
            # it waited for the worker's lock is ahead of it.
            if self.stopping:
                raise _Stopped(reason)
            return fn(model, model_dir)
        return await self.model.on_model(unless_stopped)


def _scorer(tokenizer: Tokenizer, doc: EvalDoc
            ) -> Callable[[torch.nn.Module, Path | None], list[float]]:
    return lambda model, _: score_doc(model, tokenizer, doc)


def _find_tokenizer(model: torch.nn.Module, model_dir: Path | None) -> Tokenizer | None:
    """The run's tokenizer: beside the model's files (a peer's model: the shared JSON), or
    in the directory transformers loaded it from (a Hub snapshot)."""
    places = [model_dir, getattr(model, "name_or_path", None)]
    for place in places:
        if place and (Path(place) / "tokenizer.json").is_file():
            return Tokenizer.from_file(str(Path(place) / "tokenizer.json"))
    return None
