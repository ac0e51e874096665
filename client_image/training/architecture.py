"""The run's `architecture` (Psyche's LLMArchitecture) against the checkpoint's config.

    check_architecture(config, architecture) -> None      raises ArchitectureMismatch
    check_tensor_parallel(config, tp) -> None             raises ArchitectureMismatch
    ARCHITECTURE_MODEL_TYPES: architecture -> the config model_types it accepts (None: any)
    TENSOR_PARALLEL_MODEL_TYPES

Psyche builds the model its run names: HfLlama a Llama, HfDeepseek a DeepSeek-V3 MoE,
HfAuto whatever the checkpoint's config says. This client loads every checkpoint with
transformers' AutoModelForCausalLM, so the architecture is a promise about the
checkpoint, checked on its config.json (`model_type`) before any weight is loaded: a
checkpoint of another family would train and share a model the run's other clients (and
Psyche's) do not have. A mismatch is one line naming both, e.g. "the run says HfLlama,
the checkpoint is deepseek_v3 (DeepseekV3ForCausalLM)".

- HfLlama: model_type llama (LlamaForCausalLM).
- HfDeepseek: model_type deepseek_v3 (DeepseekV3ForCausalLM: MLA attention, the first
  `first_k_dense_replace` layers dense, the others a sigmoid-routed MoE of routed experts
  plus shared ones). transformers keeps the routed experts of a layer fused, as 3-D
  [experts, out, in] parameters (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`),
  and converts them to and from DeepSeek's per-expert tensors when it saves and loads;
  DisTrO cuts a 3-D parameter into `experts` matrices (training/distro.py). The router's
  `e_score_correction_bias` is a buffer: loaded and saved, never trained.
- HfAuto: any causal LM transformers can build.
- Torchtitan: never reaches the client (coordinator/capabilities.py refuses it).

Tensor parallelism (training/parallel.py `apply_tp`) splits Llama decoder blocks only:
T > 1 with any other model_type is refused the same way. FSDP2 over D shards any decoder
with `model.layers` (the tiny DeepSeek MoE trains over D = 2 like one device:
tests/training/test_deepseek_moe.py).
"""

from __future__ import annotations

from typing import Any

from client_image.training.model import ModelLoadError

ARCHITECTURE_MODEL_TYPES: dict[str, frozenset[str] | None] = {
    "HfLlama": frozenset({"llama"}),
    "HfDeepseek": frozenset({"deepseek_v3"}),
    "HfAuto": None,
}
TENSOR_PARALLEL_MODEL_TYPES = frozenset({"llama"})


class ArchitectureMismatch(ModelLoadError):
    """The checkpoint is not the architecture the run names (or cannot be split over T)."""


def _described(config: Any) -> str:
    model_type = getattr(config, "model_type", None) or "of no model_type"
    classes = getattr(config, "architectures", None) or []
    return f"{model_type} ({', '.join(classes)})" if classes else str(model_type)


def check_architecture(config: Any, architecture: str) -> None:
    """Raise ArchitectureMismatch unless the checkpoint `config` (a transformers config) is
    of the family `architecture` names (module docstring)."""
    if architecture not in ARCHITECTURE_MODEL_TYPES:
        raise ArchitectureMismatch(
            f"the run says {architecture}: this client loads "
            f"{', '.join(ARCHITECTURE_MODEL_TYPES)} models only")
    accepted = ARCHITECTURE_MODEL_TYPES[architecture]
    if accepted is not None and getattr(config, "model_type", None) not in accepted:
        raise ArchitectureMismatch(
            f"the run says {architecture}, the checkpoint is {_described(config)}: "
            f"{architecture} needs a {' or '.join(sorted(accepted))} checkpoint")


def check_tensor_parallel(config: Any, tp: int) -> None:
    """Raise ArchitectureMismatch when T > 1 and the model cannot be split over T ranks."""
    if tp > 1 and getattr(config, "model_type", None) not in TENSOR_PARALLEL_MODEL_TYPES:
        raise ArchitectureMismatch(
            f"tensor parallelism (T = {tp}) splits Llama models only, the checkpoint is "
            f"{_described(config)}: run it with T = 1")


__all__ = ["ARCHITECTURE_MODEL_TYPES", "TENSOR_PARALLEL_MODEL_TYPES", "ArchitectureMismatch",
           "check_architecture", "check_tensor_parallel"]
