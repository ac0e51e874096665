"""The client's model and DisTrO trainer, driven from one worker thread.

torch work never runs on the event loop: every call here goes through
`asyncio.to_thread` under one lock, in the order the round logic issues them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import torch

from client_image.formats.distro_wire import declared_settings
from client_image.formats.replay_settings import ReplaySettings
from client_image.runtime.model_loading import (
    TOKENIZER_FILE,
    TRANSFORMERS_LOADING,
    LoadChecks,
    ModelLoadError,
    dummy_model,
    hub_model,
    peer_model,
)
from client_image.runtime.model_scratch import ModelScratch
from client_image.runtime.ports import Unrunnable
from client_image.runtime.trainer_choice import (
    LocalTrainer,
    TrainerSettings,
    WorkerError,
    local_trainer,
)
from client_image.training import (
    DistroTrainer,
    TrainStepOutput,
    save_checkpoint,
)
from client_image.training.checkpoint import bf16_state_dict, checkpoint_config
from client_image.training.model import round_to_bf16_
from client_image.training.parallel import ParallelismError
from client_image.training.precision import configure_backends, resolve_compute_dtype
from client_image.training.rank_group import BuildSpec, RankFailed, RankGroup, RankSetup
from client_image.verification.adversary import Adversary
from client_image.verification.checks import (
    Fingerprint,
    FingerprintCache,
    fingerprint,
    screen_payloads,
)
from client_image.verification.followers import Checked, Followers
from client_image.verification.settings import capture, split_over_ranks
from coordinator.config import DistroOptimizer, LLMConfig

_P = ParamSpec("_P")
_T = TypeVar("_T")
log = logging.getLogger(__name__)


def _retrieve(call: asyncio.Future[Any]) -> None:
    """A shielded call's error is its caller's; when the caller was cancelled, nobody
    else reads it (and asyncio would log it as never retrieved)."""
    if not call.cancelled():
        call.exception()


class TrainingWorker:
    def __init__(self, *, device: str = "cpu", micro_batch_size: int = 1,
                 dtype: str = "auto", activation_checkpointing: bool = False,
                 ranks: RankSetup | None = None, adversary: str | None = None,
                 dummy_training_delay_s: float = 0.0):
        self.device = device
        # What a step of a Dummy-optimizer run sleeps instead of training (Psyche's flag).
        self.dummy_training_delay_s = dummy_training_delay_s
        # Testing verification only: this client publishes dishonest results.
        self.adversary = Adversary(adversary) if adversary is not None else None
        # D x T > 1: the model lives on several ranks (training/rank_group.py); this
        # process is rank 0 and runs every model call as a command all ranks run.
        self.rank_setup = ranks if ranks is not None and ranks.dims.enabled else None
        self.ranks: RankGroup | None = None
        self._checkpoint_config: dict[str, object] = {}  # the ranks' model (as written)
        self.micro_batch_size = micro_batch_size
        # The compute dtype only: weights stay fp32 on every client (training/precision.py).
        self.compute = resolve_compute_dtype(dtype, device)
        self.activation_checkpointing = activation_checkpointing
        configure_backends(device)
        self.model: torch.nn.Module | None = None
        self.trainer: LocalTrainer | None = None
        self.followers: Followers | None = None  # shadows of followed trainers, this epoch
        # Each sender's last declared replay settings, from the results screened here: the
        # next epoch's shadows replay in them (verification/followers.py).
        self.declared_by: dict[bytes, ReplaySettings] = {}
        self._fingerprints = FingerprintCache()  # what the checks need of each download
        self.model_dir: Path | None = None  # where config/tokenizer files live
        # Also removes the scratch directories SIGKILLed clients left (model_scratch.py).
        self._scratch = ModelScratch()
        self._lock = asyncio.Lock()
        self._in_flight: asyncio.Future[Any] | None = None  # the worker thread's call

    @property
    def loaded(self) -> bool:
        return self.trainer is not None

    async def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        async with self._lock:
            # Shielded: a cancelled caller (a stopping client) leaves the thread's call to
            # end by itself, and `wait_idle` can wait for it (a checkpoint being written).
            call = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
            call.add_done_callback(_retrieve)
            self._in_flight = call
            try:
                return await asyncio.shield(call)
            except RankFailed as exc:  # a lost rank cannot come back in this process
                raise Unrunnable(str(exc)) from exc

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the call running in the worker thread (a training
        step, a checkpoint being written) to end; whether it did. A stopping client lets a
        checkpoint write finish this way (one not finished in time is abandoned whole: it
        is written under a staging name and renamed when complete)."""
        call = self._in_flight
        if call is None or call.done():
            return True
        await asyncio.wait({call}, timeout=timeout_s)
        return call.done()

    # ------------------------------------------------------------------ loading
    def _make_trainer(self, model: torch.nn.Module, llm: LLMConfig, start_step: int) -> None:
        self.followers = None  # they shadowed the previous model
        settings = TrainerSettings(self.micro_batch_size, self.compute,
                                   self.activation_checkpointing, self.dummy_training_delay_s,
                                   split=self.rank_setup is not None)
        trainer = local_trainer(model, llm, start_step, settings)
        if trainer is not None:
            self.model, self.trainer = model, trainer
        else:
            assert isinstance(llm.optimizer, DistroOptimizer)
            self._build_on_ranks(model, llm.optimizer, llm, start_step)

    def _build_on_ranks(self, model: torch.nn.Module, optimizer: DistroOptimizer,
                        llm: LLMConfig, start_step: int) -> None:
        """Hand the loaded model to every rank (config + full fp32 weights); each builds
        its part of the mesh. This process keeps only its own shards."""
        assert self.rank_setup is not None
        if self.ranks is None:
            try:
                self.ranks = RankGroup(self.rank_setup, self.device)
            except ParallelismError as exc:
                raise WorkerError(str(exc)) from None
        config = getattr(model, "config", None)
        to_json = getattr(config, "to_json_string", None)
        if not callable(to_json):
            raise WorkerError("only transformers models can be split across devices")
        spec = BuildSpec(
            config_json=to_json(), state={k: v.detach().cpu() for k, v in model.state_dict().items()},
            optimizer=optimizer, lr_schedule=llm.lr_schedule,
            cold_start_warmup_steps=llm.cold_start_warmup_steps, start_step=start_step,
            dims=self.rank_setup.dims, compute=self.compute,
            micro_batch_size=self.micro_batch_size,
            activation_checkpointing=self.activation_checkpointing)
        self._checkpoint_config = checkpoint_config(model, self.model_dir)
        del model
        try:
            self.ranks.run("build", spec)
        except ParallelismError as exc:
            raise WorkerError(str(exc)) from None
        self.model = self.ranks.executor.model
        self.trainer = self.ranks.executor.trainer
        if self.trainer is not None:  # declared like an unsplit trainer (trainer_choice.py)
            dims = self.rank_setup.dims
            self.trainer.declared = split_over_ranks(
                capture(self.trainer.compute, self.trainer.micro_batch_size, self.device),
                dims.dp, dims.tp)

    def _full_model(self) -> torch.nn.Module:
        """A plain bf16 model holding the all-gathered weights (for save_pretrained)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        assert self.ranks is not None
        state = self.ranks.run("full_state_dict")
        directory = Path(self._scratch.name) / "full"
        directory.mkdir(exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self._checkpoint_config))
        config = AutoConfig.from_pretrained(directory)
        with torch.device("meta"), TRANSFORMERS_LOADING:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(state, strict=False, assign=True)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        return model

    def _checks(self) -> LoadChecks:
        return LoadChecks(self.device, self.rank_setup.dims if self.rank_setup else None,
                          self.micro_batch_size, self.compute, self.activation_checkpointing)

    async def load_from_hub(self, repo_id: str, revision: str | None, llm: LLMConfig,
                            start_step: int) -> None:
        def load() -> None:
            model = hub_model(repo_id, revision, llm, self._checks())
            self.model_dir = Path(repo_id) if Path(repo_id).is_dir() else None
            self._make_trainer(model, llm, start_step)
        await self._run(load)

    async def load_dummy(self, repo_id: str, llm: LLMConfig, start_step: int) -> None:
        """A Dummy checkpoint: the model built from its config with seeded weights, the
        same on every client, downloading nothing (training/dummy_model.py)."""
        def load() -> None:
            try:
                model = dummy_model(repo_id, llm, self._checks())
            except ModelLoadError as exc:
                raise WorkerError(str(exc)) from None
            self.model_dir = Path(repo_id) if repo_id and Path(repo_id).is_dir() else None
            self._make_trainer(model, llm, start_step)
        await self._run(load)

    async def load_from_peers(self, config_json: str, tokenizer_json: str | None,
                              state_dict: dict[str, torch.Tensor], llm: LLMConfig,
                              start_step: int) -> None:
        def load() -> None:
            directory = Path(self._scratch.name)
            try:
                model = peer_model(config_json, tokenizer_json, state_dict, llm,
                                   self._checks(), directory)
            except ModelLoadError as exc:
                raise WorkerError(str(exc)) from None
            self.model_dir = directory
            self._make_trainer(model, llm, start_step)
        await self._run(load)

    async def round_to_bf16(self) -> None:
        """Psyche's cooldown: round the weights to bf16 in place, before they are saved and
        shared, so that this client goes on from exactly the model its joiners load."""
        assert self.model is not None
        if self.ranks is not None:
            await self._run(self.ranks.run, "round_to_bf16")
            return
        await self._run(round_to_bf16_, self.model)

    async def sharing_payload(self) -> tuple[dict[str, torch.Tensor], str, str | None]:
        """A frozen bf16 copy of the weights plus config and tokenizer JSON, for joiners.
        The config is the checkpoint's (the original config.json's fields kept), so that a
        joiner's checkpoints carry the same config.json as this client's. Made in the
        worker thread between the other model calls, like them: never from a model that a
        training step or an apply is changing (nor, split over ranks, on the event loop)."""
        return await self._run(self._sharing_payload)

    def _sharing_payload(self) -> tuple[dict[str, torch.Tensor], str, str | None]:
        assert self.model is not None
        if self.ranks is not None:  # gathered copies, by a command the ranks run in turn
            state = self.ranks.run("full_state_dict")
            config_json = json.dumps(self._checkpoint_config)
        else:
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
        if self.ranks is not None:
            return await self._run(self.ranks.run, "train", step, batch, batch_id, cold_start)
        adversary = self.adversary
        if adversary is None or not isinstance(trainer, DistroTrainer):
            return await self._run(trainer.train, step, batch, batch_id=batch_id,
                                   cold_start=cold_start)

        def dishonest() -> TrainStepOutput:
            assert adversary is not None
            out = trainer.train(step, adversary.batch(batch), batch_id=batch_id,
                                cold_start=cold_start)
            payload = adversary.payload(out.payload, trainer) if out.payload else out.payload
            return dataclasses.replace(out, payload=payload)
        return await self._run(dishonest)

    async def decode(self, payload: bytes) -> Fingerprint:
        """Validate a peer's payload against our model (raises ResultDecodeError) and keep
        what the cheap checks need of it, its fingerprint, not the decoded result. Runs off
        the worker lock: decoding reads only the plans, so downloads never wait for
        training, nor training for them."""
        assert self.trainer is not None
        trainer = self.trainer

        def run() -> Fingerprint:
            return fingerprint(trainer.decode(payload), trainer.plans)
        kept = await asyncio.to_thread(run)
        self._fingerprints.add(payload, kept)
        return kept

    def _fingerprint_of(self, payload: bytes) -> Fingerprint:
        """The fingerprint kept at download, or (a result never downloaded here: our own)
        decoded now. Raises ResultDecodeError."""
        assert self.trainer is not None
        kept = self._fingerprints.get(payload)
        if kept is not None:
            return kept
        return fingerprint(self.trainer.decode(payload), self.trainer.plans)

    async def apply(self, step: int, payloads: Sequence[bytes]) -> int:
        """Apply the consensus payloads of an earlier step; returns how many applied."""
        assert self.trainer is not None
        trainer = self.trainer
        if self.ranks is not None:
            return await self._run(self.ranks.run, "apply", step, list(payloads))

        return await self._run(trainer.apply_payloads, step, list(payloads))

    async def screen(self, of_step: int, results: Sequence[tuple[bytes, bytes]],
                     previous: Mapping[bytes, bytes]) -> dict[int, tuple[str, str]]:
        """Cheap checks on a step's consensus results (verification/checks.py,
        `screen_payloads`), from the fingerprints kept at download."""
        assert self.trainer is not None
        trainer = self.trainer

        def run() -> dict[int, tuple[str, str]]:
            left_out = screen_payloads(results, previous, self._fingerprint_of, trainer.plans,
                                       trainer.learning_rate(of_step))
            for sender, payload in results:
                settings = declared_settings(payload, trainer.plans)
                if settings is not None:
                    self.declared_by[sender] = settings
            # The next screens compare with these results and with later steps' only.
            self._fingerprints.forget_before(
                of_step, [p for _, p in results] + list(previous.values()))
            return left_out
        return await self._run(run)

    async def idle(self, step: int) -> None:
        assert self.trainer is not None
        if self.ranks is not None:
            await self._run(self.ranks.run, "idle", step)
            return
        await self._run(self.trainer.idle, step)

    # ------------------------------------------------------------------ verification
    async def reset_delta(self) -> None:
        """Start the epoch from a zero delta, so followers can replay us (verification on)."""
        if self.ranks is not None:
            await self._run(self.ranks.run, "reset_delta")
            return
        assert self.trainer is not None
        await self._run(self.trainer.reset_delta)

    async def follow(self, trainers: Sequence[bytes], start_step: int,
                     joined_classes: Mapping[bytes, int] | None = None) -> bool:
        """Shadow `trainers` this epoch (verification/followers.py); False when this client
        cannot replay: a model split over ranks is not supported yet."""
        trainer = self.trainer
        if (self.ranks is not None or not isinstance(trainer, DistroTrainer)
                or self.model is None):
            self.followers = None  # SparseLoCo runs have verification off (capabilities.py)
            return not trainers
        model = self.model

        def shadow(start_step: int, settings: ReplaySettings) -> DistroTrainer:
            return DistroTrainer(model, trainer.config, trainer.lr_schedule,
                                 micro_batch_size=settings.micro_batch,
                                 cold_start_warmup_steps=trainer.cold_start_warmup_steps,
                                 start_step=start_step,
                                 compute=resolve_compute_dtype(settings.compute, self.device),
                                 declared=settings)
        own = trainer.declared or capture(trainer.compute, trainer.micro_batch_size,
                                          self.device)
        followers = Followers(shadow, own, known=self.declared_by)
        await self._run(followers.follow, list(trainers), start_step, joined_classes)
        self.followers = followers
        return True

    async def replay(self, trainer: bytes, step: int, batch: torch.Tensor,
                     batch_id: tuple[int, int], cold_start: bool) -> None:
        if self.followers is not None:
            await self._run(self.followers.replay, trainer, step, batch, batch_id, cold_start)

    async def verify(self, trainer: bytes, step: int, published: bytes) -> Checked | None:
        if self.followers is None:
            return None
        return await self._run(self.followers.verify, trainer, step, published)

    async def on_model(self, fn: Callable[[torch.nn.Module, Path | None], _T]) -> _T:
        """Run fn(model, model_dir) in the worker thread, between the training calls (the
        evals of runtime/evaluating.py); WorkerError when no one process holds the model."""
        if self.ranks is not None:
            raise WorkerError("evals do not run on a model split across ranks yet")

        def call() -> _T:
            if self.model is None:
                raise WorkerError("no model is loaded")
            return fn(self.model, self.model_dir)
        return await self._run(call)

    async def save_checkpoint(self, checkpoint_dir: Path, run_id: str, step: int,
                              keep_steps: int) -> Path:
        assert self.model is not None
        model = self.model
        if self.ranks is not None:
            def save_gathered() -> Path:
                return save_checkpoint(self._full_model(), checkpoint_dir, run_id, step,
                                       tokenizer_dir=self.model_dir, keep_steps=keep_steps)
            return await self._run(save_gathered)
        return await self._run(save_checkpoint, model, checkpoint_dir, run_id, step,
                               tokenizer_dir=self.model_dir, keep_steps=keep_steps)

    def close(self, ranks_timeout_s: float = 30.0) -> None:
        """Stop the rank processes (at most `ranks_timeout_s`, then they are killed) and
        drop the scratch files."""
        if self.ranks is not None:
            self.ranks.close(ranks_timeout_s)
            self.ranks = None
        self._scratch.cleanup()

    def kill_ranks(self) -> None:
        """Kill the rank processes at once (a stop out of time; safe from any thread)."""
        ranks = self.ranks
        if ranks is not None:
            ranks.kill()
