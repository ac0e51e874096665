"""Building the client's model from where a run's checkpoint is: the Hub (or a local
directory), a Dummy checkpoint's config, or the weights peers sent. Each refuses a model
this client cannot train before loading any weight (the wrong architecture, or one that
does not fit its GPU): that is its permanent problem (`Unrunnable`), not a retry's.

Called on the worker thread (runtime/worker.py), which then builds the trainer.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from client_image.runtime.ports import Unrunnable
from client_image.training import load_causal_lm
from client_image.training.architecture import (
    ArchitectureMismatch,
    check_architecture,
    check_tensor_parallel,
)
from client_image.training.model import ModelLoadError, resolve_model_dir
from client_image.training.parallel import ParallelDims
from client_image.training.precision import ComputeDType
from coordinator.checkpoint_reports import is_commit_id
from coordinator.config import LLMConfig
from psyche_common.hub_history import ask_main_history

TOKENIZER_FILE = "tokenizer.json"
log = logging.getLogger(__name__)

# transformers keeps loading flags in module globals (weight init on/off) that it sets and
# restores around each load: two loads at once in one process (in-process clients in
# tests and simulations) can restore them wrongly and leave every later model untied.
# One client loads one model at a time anyway; this makes it one per process.
TRANSFORMERS_LOADING = threading.Lock()


@dataclass(frozen=True)
class LoadChecks:
    """What a model must suit on this client: its device, its D x T layout and the memory
    of a step (training/memory_plan.py)."""

    device: str
    dims: ParallelDims | None
    micro_batch_size: int
    compute: ComputeDType
    activation_checkpointing: bool

    def refuse_other_architecture(self, config: object, llm: LLMConfig) -> None:
        """The checkpoint must be the run's architecture, and splittable over T if T > 1
        (training/architecture.py)."""
        try:
            check_architecture(config, llm.architecture)
            check_tensor_parallel(config, self.dims.tp if self.dims else 1)
        except ArchitectureMismatch as exc:
            raise Unrunnable(str(exc)) from None

    def refuse_unless_fits(self, config: object, llm: LLMConfig) -> None:
        """On a GPU, check the plan before any weight is loaded."""
        if torch.device(self.device).type != "cuda":
            return  # host memory: the OS decides (swap, other processes); nothing to plan
        from client_image.training.memory_plan import run_refusal

        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        reason = run_refusal(config, llm, int(free), dp=self.dims.dp if self.dims else 1,
                             tp=self.dims.tp if self.dims else 1,
                             micro_batch_size=self.micro_batch_size, compute=self.compute,
                             activation_checkpointing=self.activation_checkpointing)
        if reason is not None:
            raise Unrunnable(f"this run does not fit on {self.device}: {reason} "
                             "(`psyche-client plan` shows the bytes)")

    def refuse(self, config: object, llm: LLMConfig) -> None:
        self.refuse_other_architecture(config, llm)
        self.refuse_unless_fits(config, llm)


def check_tied(model: torch.nn.Module, config: object) -> None:
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
        raise ModelLoadError("the config ties the output embedding to the input one, but the "
                             "model built from it holds them apart")


def hub_model(repo_id: str, revision: str | None, llm: LLMConfig,
              checks: LoadChecks) -> torch.nn.Module:
    """The run's checkpoint from the Hub (or a local directory), fp32 on the device."""
    from transformers import AutoConfig

    refuse_off_main(repo_id, revision)
    config = AutoConfig.from_pretrained(resolve_model_dir(repo_id, revision=revision))
    checks.refuse(config, llm)
    with TRANSFORMERS_LOADING:
        return load_causal_lm(repo_id, device=checks.device, revision=revision)


def refuse_off_main(repo_id: str, revision: str | None) -> None:
    """A Hub checkpoint is loaded only from a commit on its repository's main branch
    (docs/coordinator.md, "Checkpoint reports"): on Solana the program cannot ask the Hub,
    so a client of the epoch may report a pull request's commit (refs/pr/N, which anyone
    may open) and every joiner would load it. ModelLoadError for a commit the Hub says is
    not on main (or does not exist); a Hub that does not answer (offline, HF_HUB_OFFLINE)
    leaves the load to the cache, with a warning. A local directory, or a revision that
    is not a commit id, is not the Hub's to judge."""
    if revision is None or not is_commit_id(revision) or Path(repo_id).expanduser().exists():
        return
    answer = ask_main_history(repo_id, revision)
    if answer.problem is None:
        return
    if not answer.reached:
        log.warning("loading the run's checkpoint unchecked: %s", answer.problem)
        return
    raise ModelLoadError(f"not loading the run's checkpoint: {answer.problem}")


def dummy_model(repo_id: str, llm: LLMConfig, checks: LoadChecks) -> torch.nn.Module:
    """A Dummy checkpoint: the model built from its config with seeded weights, the same
    on every client, downloading nothing (training/dummy_model.py)."""
    from client_image.training.dummy_model import DummyModelError, dummy_causal_lm

    try:
        with TRANSFORMERS_LOADING:
            model = dummy_causal_lm(repo_id)
    except DummyModelError as exc:
        raise ModelLoadError(str(exc)) from None
    checks.refuse(model.config, llm)
    model.to(checks.device)
    model.train()
    return model


def peer_model(config_json: str, tokenizer_json: str | None,
               state_dict: dict[str, torch.Tensor], llm: LLMConfig, checks: LoadChecks,
               directory: Path) -> torch.nn.Module:
    """The model peers sent (its config, tokenizer and weights); its files are written to
    `directory`, where the checkpoints later find them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    (directory / "config.json").write_text(config_json)
    if tokenizer_json:
        (directory / TOKENIZER_FILE).write_text(tokenizer_json)
    config = AutoConfig.from_pretrained(directory)
    checks.refuse(config, llm)
    # fp32 like the Hub path (load_causal_lm): from_config would take the config's
    # `dtype`, which is the original's (say bfloat16), not what the peers train in.
    with TRANSFORMERS_LOADING:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if unexpected or [m for m in missing if m not in state_dict]:
        tied = set(getattr(model, "_tied_weights_keys", None) or [])
        really_missing = [m for m in missing if m not in tied]
        if unexpected or really_missing:
            raise ModelLoadError(f"peer model does not match its config: missing "
                                 f"{really_missing[:5]}, unexpected {unexpected[:5]}")
    check_tied(model, config)
    model.to(checks.device)
    model.train()
    return model
