"""The client's model and DisTrO trainer, driven from one worker thread.

torch work never runs on the event loop: every call here goes through
`asyncio.to_thread` under one lock, in the order the round logic issues them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

import torch

from client_image.training import (
    DistroResult,
    DistroTrainer,
    ResultDecodeError,
    TrainStepOutput,
    load_causal_lm,
    save_checkpoint,
)
from client_image.training.checkpoint import bf16_state_dict, checkpoint_config
from client_image.training.model import round_to_bf16_
from client_image.training.precision import (
    configure_backends,
    enable_activation_checkpointing,
    resolve_compute_dtype,
)
from coordinator.config import DistroOptimizer, LLMConfig

_P = ParamSpec("_P")
_T = TypeVar("_T")
log = logging.getLogger(__name__)
TOKENIZER_FILE = "tokenizer.json"


class WorkerError(RuntimeError):
    """The model cannot be loaded or trained with this run's configuration."""


# transformers keeps loading flags in module globals (weight init on/off) that it sets and
# restores around each load: two loads at once in one process (in-process clients in
# tests and simulations) can restore them wrongly and leave every later model untied.
# One client loads one model at a time anyway; this makes it one per process.
_TRANSFORMERS_LOADING = threading.Lock()


def _check_tied(model: torch.nn.Module, config: object) -> None:
    """A config that ties the output embedding to the input one must get a model whose two
    are one tensor: the shared weights carry it once, so an untied output head would keep
    its random init and this client would diverge from its peers without a word."""
    if not getattr(config, "tie_word_embeddings", False):
        return
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    inputs = get_in() if callable(get_in) else None
    outputs = get_out() if callable(get_out) else None
    if inputs is not None and outputs is not None and outputs.weight is not inputs.weight:
        raise WorkerError("the config ties the output embedding to the input one, but the "
                          "model built from it holds them apart")


class TrainingWorker:
    def __init__(self, *, device: str = "cpu", micro_batch_size: int = 1,
                 dtype: str = "auto", activation_checkpointing: bool = False):
        self.device = device
        self.micro_batch_size = micro_batch_size
        # The compute dtype only: weights stay fp32 on every client (training/precision.py).
        self.compute = resolve_compute_dtype(dtype, device)
        self.activation_checkpointing = activation_checkpointing
        configure_backends(device)
        self.model: torch.nn.Module | None = None
        self.trainer: DistroTrainer | None = None
        self.model_dir: Path | None = None  # where config/tokenizer files live
        self._scratch = tempfile.TemporaryDirectory(prefix="psyche-client-model-")
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        return self.trainer is not None

    async def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        async with self._lock:
            return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------ loading
    def _make_trainer(self, model: torch.nn.Module, llm: LLMConfig, start_step: int) -> None:
        if not isinstance(llm.optimizer, DistroOptimizer):
            raise WorkerError("a networked run needs the Distro optimizer (AdamW shares nothing)")
        if self.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.model = model
        self.trainer = DistroTrainer(
            model, llm.optimizer, llm.lr_schedule, micro_batch_size=self.micro_batch_size,
            cold_start_warmup_steps=llm.cold_start_warmup_steps, start_step=start_step,
            compute=self.compute)

    async def load_from_hub(self, repo_id: str, revision: str | None, llm: LLMConfig,
                            start_step: int) -> None:
        def load() -> None:
            with _TRANSFORMERS_LOADING:
                model = load_causal_lm(repo_id, device=self.device, revision=revision)
            self.model_dir = Path(repo_id) if Path(repo_id).is_dir() else None
            self._make_trainer(model, llm, start_step)
        await self._run(load)

    async def load_from_peers(self, config_json: str, tokenizer_json: str | None,
                              state_dict: dict[str, torch.Tensor], llm: LLMConfig,
                              start_step: int) -> None:
        def load() -> None:
            from transformers import AutoConfig, AutoModelForCausalLM

            directory = Path(self._scratch.name)
            (directory / "config.json").write_text(config_json)
            if tokenizer_json:
                (directory / TOKENIZER_FILE).write_text(tokenizer_json)
            config = AutoConfig.from_pretrained(directory)
            # fp32 like the Hub path (load_causal_lm): from_config would take the config's
            # `dtype`, which is the original's (say bfloat16), not what the peers train in.
            with _TRANSFORMERS_LOADING:
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            missing, unexpected = model.load_state_dict(state_dict, strict=False)
            if unexpected or [m for m in missing if m not in state_dict]:
                tied = set(getattr(model, "_tied_weights_keys", None) or [])
                really_missing = [m for m in missing if m not in tied]
                if unexpected or really_missing:
                    raise WorkerError(f"peer model does not match its config: missing "
                                      f"{really_missing[:5]}, unexpected {unexpected[:5]}")
            _check_tied(model, config)
            model.to(self.device)
            model.train()
            self.model_dir = directory
            self._make_trainer(model, llm, start_step)
        await self._run(load)

    async def round_to_bf16(self) -> None:
        """Psyche's cooldown: round the weights to bf16 in place, before they are saved and
        shared, so that this client goes on from exactly the model its joiners load."""
        assert self.model is not None
        await self._run(round_to_bf16_, self.model)

    def sharing_payload(self) -> tuple[dict[str, torch.Tensor], str, str | None]:
        """A frozen bf16 copy of the weights plus config and tokenizer JSON, for joiners.
        The config is the checkpoint's (the original config.json's fields kept), so that a
        joiner's checkpoints carry the same config.json as this client's."""
        assert self.model is not None
        # A copy even of bf16 CPU weights: they are served while training goes on.
        state = bf16_state_dict(self.model, copy=True)
        config_json = json.dumps(checkpoint_config(self.model, self.model_dir))
        tokenizer = None
        if self.model_dir is not None and (self.model_dir / TOKENIZER_FILE).is_file():
            tokenizer = (self.model_dir / TOKENIZER_FILE).read_text()
        return state, config_json, tokenizer

    # ------------------------------------------------------------------ training
    async def train(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
                    cold_start: bool) -> TrainStepOutput:
        assert self.trainer is not None
        trainer = self.trainer

        return await self._run(trainer.train, step, batch, batch_id=batch_id,
                               cold_start=cold_start)

    async def decode(self, payload: bytes) -> DistroResult:
        """Validate a peer's payload against our model; raises ResultDecodeError."""
        assert self.trainer is not None
        return await self._run(self.trainer.decode, payload)

    async def apply(self, step: int, payloads: Sequence[bytes]) -> int:
        """Apply the consensus payloads of an earlier step; returns how many applied."""
        assert self.trainer is not None
        trainer = self.trainer

        def run() -> int:
            results = []
            for payload in payloads:
                try:
                    results.append(trainer.decode(payload))
                except ResultDecodeError as exc:  # verified on download; never expected
                    log.error("step %d: dropping a payload that no longer decodes: %s", step, exc)
            trainer.apply(step, results)
            return len(results)
        return await self._run(run)

    async def save_checkpoint(self, checkpoint_dir: Path, run_id: str, step: int,
                              keep_steps: int) -> Path:
        assert self.model is not None
        model = self.model
        return await self._run(save_checkpoint, model, checkpoint_dir, run_id, step,
                               tokenizer_dir=self.model_dir, keep_steps=keep_steps)

    def close(self) -> None:
        self._scratch.cleanup()
