"""What this implementation's client can run, beyond what parses.

    unsupported_fields(state_file) -> list[str]

A state file can be valid (coordinator/config.py accepts every value of Psyche's format)
and still name something our client cannot do. This lists each such field, one line per
problem, as `dotted.key: Value is not supported by this client (supported: A, B): why`,
e.g. `model.LLM.architecture: Torchtitan is not supported by this client
(supported: HfLlama, HfDeepseek, HfAuto): ...`. `psyche-coordinator
validate-config` prints these lines and exits 1, and `psyche-coordinator run` refuses to
start with them, so that a run the clients would fail in (at their first warm-up, after
the coordinator has waited for them) is refused before anyone joins. Only a state file
that parses is checked.

Each rule states what the client code does (docs/run-config.md, "What this client runs");
tests/client_runtime/test_client_capabilities.py checks the client still refuses them:

- data_location: client_image/runtime/client.py `_open_data` opens Server (the TCP data
  server) and, through client_image/data `open_provider`, Local, Http, Dummy (zeros, as
  Psyche's), Preprocessed (parquet) and WeightedHttp (a blend of Http locations): every
  variant; of Http's locations (also inside WeightedHttp), `location_urls` reads
  SingleUrl, UrlList and NumberedFiles, and client_image/data/gcs.py `open_gcp` lists
  and reads Gcp buckets.
- checkpoint: client_image/runtime/model_keeper.py `load` loads P2P and P2PGcs (from
  peers), Hub (or a local directory), Gcs (downloaded from its bucket and prefix,
  client_image/training/gcs_checkpoint.py) and Dummy (below). The coordinator turns a
  P2P checkpoint back into Hub when none of the last epoch's clients is in the next one (always the case
  at a run's first epoch), and P2PGcs into Gcs; it turns Dummy into P2P only at the end
  of a cooldown (coordinator/core.py `start_warmup`, `end_cooldown`). So every variant
  that parses loads.
- checkpoint Dummy: model_keeper builds it (client_image/training/dummy_model.py: repo_id's
  config.json or a small built-in Llama, weights from a fixed seed, the same on every
  client), downloading nothing.
- data_type: both. client_image/data `fetch_training_batch` gives a Finetuning run's
  trainers the samples' labels (Preprocessed parquet's `labels` column, or the TCP data
  server's; the inputs when the data has none; -100 is not in the loss) and a
  Pretraining run its tokens only. Psyche's variable-length attention (position ids,
  sequence lengths) is not used: samples are trained as whole max_seq_len rows.
- architecture: client_image/training/architecture.py checks the checkpoint's config at
  load (HfLlama: a llama, HfDeepseek: a deepseek_v3 MoE, HfAuto: any transformers causal
  LM) and the client loads it with AutoModelForCausalLM; tensor parallelism (T > 1) is
  Llama-only and refused for the others. Torchtitan models are not transformers models.
- optimizer: client_image/runtime/worker.py `_make_trainer` builds Distro, SparseLoCo and
  Dummy trainers and refuses AdamW (it shares nothing with peers, so a networked run cannot
  use it); SparseLoCo runs with verification off only (followers replay DisTrO trainers) and
  on a model that is not split across ranks. Dummy (Psyche's config/test;
  client_image/training/dummy_trainer.py) trains nothing: each step sleeps the client's
  --dummy-training-delay-secs and shares a tiny result that moves no weight; verification
  is refused with it too (there is no DisTrO step to replay).

Pure: no I/O.
"""

from __future__ import annotations

import math

from coordinator.config import HttpDataLocation, SparseLoCoOptimizer, StateFile
from coordinator.config_variants import Variant

SUPPORTED_DATA_LOCATIONS = ("Server", "Local", "Http", "Dummy", "Preprocessed", "WeightedHttp")
SUPPORTED_HTTP_LOCATIONS = ("SingleUrl", "UrlList", "NumberedFiles", "Gcp")
SUPPORTED_CHECKPOINTS = ("Hub", "P2P", "Dummy", "Gcs", "P2PGcs")
SUPPORTED_DATA_TYPES = ("Pretraining", "Finetuning")
SUPPORTED_ARCHITECTURES = ("HfLlama", "HfDeepseek", "HfAuto")
SUPPORTED_OPTIMIZERS = ("Distro", "SparseLoCo", "Dummy")

# Why each refused value cannot run (every refused value of Psyche's format has one).
REASONS: dict[str, dict[str, str]] = {
    "data_location": {},  # every variant runs
    "data_location.Http.location": {},  # every location runs (Gcp: listed, then read)
    "checkpoint": {
    },
    "data_type": {},  # both run (Finetuning trains on the samples' labels)
    "architecture": {
        "Torchtitan": "Psyche builds these models with torchtitan; the client loads only "
                      "transformers models",
    },
    "optimizer": {
        "AdamW": "a networked run needs the Distro optimizer (AdamW shares nothing with peers)",
    },
}

# Optimizers that run with verification_percent = 0 only, and why.
VERIFICATION_REASONS: dict[str, str] = {
    "SparseLoCo": "verifiers replay DisTrO trainers only",
    "Dummy": "verifiers replay DisTrO trainers only (a Dummy step computes nothing to "
             "compare with)",
}


def _problem(key: str, value: str, supported: tuple[str, ...], prefix: str) -> str | None:
    if value in supported:
        return None
    why = REASONS.get(key, {}).get(value)
    line = (f"{prefix}{key}: {value} is not supported by this client "
            f"(supported: {', '.join(supported)})")
    return f"{line}: {why}" if why else line


def _tag(variant: Variant) -> str:
    return type(variant).TAG


def unsupported_fields(state_file: StateFile, prefix: str = "model.LLM.") -> list[str]:
    """One line per field value of `state_file` that this implementation's client cannot
    run (empty: it can run all of it). See the module docstring for the rules."""
    llm = state_file.model
    checks: list[tuple[str, str, tuple[str, ...]]] = [
        ("architecture", llm.architecture, SUPPORTED_ARCHITECTURES),
        ("data_type", llm.data_type, SUPPORTED_DATA_TYPES),
        ("checkpoint", _tag(llm.checkpoint), SUPPORTED_CHECKPOINTS),
        ("data_location", _tag(llm.data_location), SUPPORTED_DATA_LOCATIONS),
        ("optimizer", _tag(llm.optimizer), SUPPORTED_OPTIMIZERS),
    ]
    if isinstance(llm.data_location, HttpDataLocation):
        checks.append(("data_location.Http.location", _tag(llm.data_location.location),
                       SUPPORTED_HTTP_LOCATIONS))
    problems = [_problem(key, value, supported, prefix) for key, value, supported in checks]
    if _tag(llm.optimizer) in VERIFICATION_REASONS and state_file.config.verification_percent:
        problems.append(
            f"config.verification_percent: {state_file.config.verification_percent} is not "
            f"supported by this client with the {_tag(llm.optimizer)} optimizer "
            f"(supported: 0): {VERIFICATION_REASONS[_tag(llm.optimizer)]}")
    return [problem for problem in problems if problem is not None]


def explanations(state_file: StateFile) -> list[str]:
    """What the run's less familiar settings mean, one line each (validate-config prints
    them after OK): today SparseLoCo's fields, with the numbers they give."""
    optimizer = state_file.model.optimizer
    if not isinstance(optimizer, SparseLoCoOptimizer):
        return []
    o, cfg = optimizer, state_file.config
    block = o.chunk * o.chunk
    k = max(1, min(block, math.ceil(o.topk_density * block - 1e-9)))
    per_client = cfg.global_batch_size_start // max(1, cfg.init_min_clients)
    extensions = []  # shown only when set: off, they are the paper's algorithm
    if o.outer_momentum:
        extensions.append(f"  outer_momentum = {o.outer_momentum}: Nesterov momentum on the "
                          "peers' mean update")
    if o.dense_max_numel:
        extensions.append(f"  dense_max_numel = {o.dense_max_numel}: tensors this small (the "
                          "norms) send every coefficient")
    return [
        f"optimizer SparseLoCo: each round a client runs inner_steps = {o.inner_steps} AdamW "
        f"steps on its share of the round's {cfg.global_batch_size_start} sequences "
        f"(about {per_client} with {cfg.init_min_clients} clients, "
        f"{max(1, per_client // o.inner_steps)} per step)",
        f"  inner_lr = {o.inner_lr}: the peak inner rate; lr_schedule gives its shape over "
        f"inner steps (round s, inner step j is step s * {o.inner_steps} + j)",
        f"  topk_density = {o.topk_density}, chunk = {o.chunk}: {k} values sent of every "
        f"{o.chunk} x {o.chunk} block of the error-fed pseudo-gradient",
        f"  quant_bits = {o.quant_bits}: each value is a sign and one of "
        f"{1 << (o.quant_bits - 1)} magnitudes of its block's scale",
        f"  error_decay = {o.error_decay}: what was not sent decays by this each round "
        "(it stands in for the outer momentum)",
        f"  outer_lr = {o.outer_lr}: the step taken along the peers' mean update",
        *extensions,
    ]


__all__ = [
    "REASONS",
    "SUPPORTED_ARCHITECTURES",
    "SUPPORTED_CHECKPOINTS",
    "SUPPORTED_DATA_LOCATIONS",
    "SUPPORTED_DATA_TYPES",
    "SUPPORTED_HTTP_LOCATIONS",
    "SUPPORTED_OPTIMIZERS",
    "VERIFICATION_REASONS",
    "explanations",
    "unsupported_fields",
]
