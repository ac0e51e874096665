"""The enum-like parts of a run configuration (Rust enums with data).

Psyche's TOML writes a Rust enum *externally tagged*: a unit variant is a string
(`shuffle = "DontShuffle"`), a newtype variant a one-key table whose value is the
payload (`data_location = { Server = "127.0.0.1:20001" }`), a struct variant a
one-key table of fields (`[model.LLM.lr_schedule.Cosine]`). In Python each variant
is its own frozen pydantic model and a field holds a plain instance; the
`ExternallyTagged` annotation unwraps the tag when validating and writes it back
when serializing, so `model_dump()` returns the TOML shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    Strict,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from coordinator.limits import STRING_MAX_BYTES

# Unsigned integer types of the on-chain layout; Strict() refuses "30" and true.
U8 = Annotated[int, Strict(), Field(ge=0, le=2**8 - 1)]
U16 = Annotated[int, Strict(), Field(ge=0, le=2**16 - 1)]
U32 = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]
U64 = Annotated[int, Strict(), Field(ge=0, le=2**64 - 1)]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
StrictStr = Annotated[str, Strict()]


def max_bytes(limit: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        size = len(value.encode())
        if size > limit:
            raise ValueError(f"must be at most {limit} bytes, got {size}")
        return value

    return check


def _nonempty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


class Variant(BaseModel):
    """One variant of an externally tagged enum.

    TAG is the TOML tag; NEWTYPE names the single field holding a newtype payload;
    UNIT marks a unit variant written as a bare string.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    TAG: ClassVar[str]
    NEWTYPE: ClassVar[str | None] = None
    UNIT: ClassVar[bool] = False

    def to_tagged(self) -> Any:
        if self.UNIT:
            return self.TAG
        payload = self.model_dump(mode="json", exclude_none=True)
        if self.NEWTYPE is not None:
            return {self.TAG: payload[self.NEWTYPE]}
        return {self.TAG: payload}


class ExternallyTagged:
    """Pydantic annotation: validate `{Tag = payload}` / `"Tag"` into a variant instance.

    Errors carry the tag in their location (`model.LLM.lr_schedule.Cosine.base_lr`).
    `rejected` maps tags that exist in Psyche but that we refuse to a reason.
    """

    def __init__(self, *variants: type[Variant], rejected: dict[str, str] | None = None):
        self.variants = {variant.TAG: variant for variant in variants}
        self.rejected = rejected or {}

    def _tag_of(self, value: Any) -> str | None:
        if isinstance(value, Variant):
            return value.TAG
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and len(value) == 1:
            tag = next(iter(value))
            return tag if isinstance(tag, str) else None
        return None

    def _reject(self, value: Any) -> Any:
        tag = self._tag_of(value)
        if tag is None and not isinstance(value, Variant):
            raise PydanticCustomError(
                "variant_shape",
                "expected a variant: one of {tags}, as a string or a one-key table",
                {"tags": ", ".join(self.variants)},
            )
        if tag in self.rejected:
            raise PydanticCustomError(
                "variant_rejected", "variant {tag} is not supported: {why}",
                {"tag": tag, "why": self.rejected[tag]},
            )
        return value

    @staticmethod
    def _unwrap(variant: type[Variant], value: Any) -> Any:
        if isinstance(value, Variant):
            return value
        if isinstance(value, str):
            return {}
        payload = value[variant.TAG]
        if variant.NEWTYPE is not None:
            return {variant.NEWTYPE: payload}
        return payload

    def __get_pydantic_core_schema__(
        self, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        choices: dict[Any, core_schema.CoreSchema] = {}
        for tag, variant in self.variants.items():
            inner = handler.generate_schema(variant)
            choices[tag] = core_schema.no_info_before_validator_function(
                functools.partial(self._unwrap, variant), inner
            )
        tags = ", ".join(self.variants)
        union = core_schema.tagged_union_schema(
            choices,
            discriminator=self._tag_of,
            custom_error_type="unknown_variant",
            custom_error_message=f"unknown variant, expected one of: {tags}",
        )
        return core_schema.no_info_before_validator_function(
            self._reject,
            union,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value: value.to_tagged()
            ),
        )


# ---------------------------------------------------------------- LR schedules
# Every schedule warms up linearly: lr(s) = init + (base - init) * s / warmup_steps.


class ConstantLR(Variant):
    TAG: ClassVar[str] = "Constant"
    base_lr: NonNegFloat
    warmup_init_lr: NonNegFloat
    warmup_steps: U32


class LinearLR(Variant):
    """After warm-up: lr falls linearly from base_lr to final_lr at total_steps."""

    TAG: ClassVar[str] = "Linear"
    base_lr: NonNegFloat
    warmup_init_lr: NonNegFloat
    final_lr: NonNegFloat
    warmup_steps: U32
    total_steps: U32

    @model_validator(mode="after")
    def _decay_window(self) -> LinearLR:
        if self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"total_steps must be > warmup_steps ({self.warmup_steps}), got {self.total_steps}"
            )
        return self


class CosineLR(LinearLR):
    """After warm-up: lr = final + (base - final) * 1/2 * (1 + cos(pi * (s - w) / (total - w)))."""

    TAG: ClassVar[str] = "Cosine"


class WarmupStableDecayLR(Variant):
    """Warm-up, stable at base_lr, cosine to cosine_decay_final_lr, linear to
    linear_decay_final_lr, then constant."""

    TAG: ClassVar[str] = "WarmupStableDecay"
    base_lr: NonNegFloat
    warmup_init_lr: NonNegFloat
    cosine_decay_final_lr: NonNegFloat
    linear_decay_final_lr: NonNegFloat
    warmup_steps: U32
    stable_steps: U32
    cosine_decay_steps: U32
    linear_decay_steps: U32


LRSchedule = ConstantLR | LinearLR | CosineLR | WarmupStableDecayLR
LR_SCHEDULE = ExternallyTagged(ConstantLR, LinearLR, CosineLR, WarmupStableDecayLR)


# ------------------------------------------------------------------ optimizers


class DistroOptimizer(Variant):
    TAG: ClassVar[str] = "Distro"
    clip_grad_norm: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] | None = None
    weight_decay: NonNegFloat | None = None
    compression_decay: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]
    compression_topk: Annotated[int, Strict(), Field(gt=0, le=2**16 - 1)]
    compression_chunk: Annotated[int, Strict(), Field(gt=0, le=2**16 - 1)]
    quantize_1bit: Annotated[bool, Strict()]
    # Ours, not Psyche's (unset is Psyche's behaviour, and leaves the serialized config as
    # Psyche's): true keeps the token embedding's and output head's rows apart,
    # transformed along the hidden dimension only (client_image/training/distro.py).
    embeddings_per_token: Annotated[bool, Strict()] | None = None


class AdamWOptimizer(Variant):
    """Local-only AdamW (shares nothing with peers)."""

    TAG: ClassVar[str] = "AdamW"
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]]
    weight_decay: NonNegFloat
    eps: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
    clip_grad_norm: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] | None = None


class SparseLoCoOptimizer(Variant):
    """SparseLoCo (arXiv 2508.15706): each round a client runs `inner_steps` AdamW steps
    on its data, then sends its error-fed pseudo-gradient as a chunked top-k
    (`topk_density` of every `chunk` x `chunk` block) at `quant_bits` bits per value;
    peers average the sparse updates and take the outer step `outer_lr`. The run's
    lr_schedule gives the inner learning rate's shape over inner steps (inner step j of
    round s is step s * inner_steps + j), scaled so its base_lr is `inner_lr`. Not a
    Psyche optimizer: an extension of this implementation."""

    TAG: ClassVar[str] = "SparseLoCo"
    inner_steps: Annotated[int, Strict(), Field(ge=1, le=1024)]
    inner_lr: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
    inner_betas: tuple[Annotated[float, Field(ge=0, lt=1)],
                       Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.95)
    inner_weight_decay: NonNegFloat = 0.0
    clip_grad_norm: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] | None = None
    topk_density: Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]
    chunk: Annotated[int, Strict(), Field(gt=0, le=2**16 - 1)]
    quant_bits: Annotated[int, Strict(), Field(ge=2, le=8)]
    error_decay: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]
    outer_lr: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
    # Extensions measured in bench/results/optimizers_sparseloco_screens_2cores.txt (neither
    # helped on the tiny model); the defaults are the paper's algorithm. outer_momentum:
    # Nesterov momentum on the peers' mean update (0: none; its buffer is client state reset
    # each epoch, so a client that missed an apply of the epoch would drift from the others).
    # dense_max_numel: a tensor of at most this many elements (the norms) keeps every
    # coefficient, so it is never starved by top-k (0: none).
    outer_momentum: Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    dense_max_numel: Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)] = 0


class DummyOptimizer(Variant):
    """Psyche's test optimizer (its config/test): no forward or backward pass, each step
    sleeps the client's --dummy-training-delay-secs and shares a tiny result that moves
    no weight (client_image/training/dummy_trainer.py), so a run exercises the whole
    protocol without learning. A unit variant: `optimizer = "Dummy"`."""

    TAG: ClassVar[str] = "Dummy"
    UNIT: ClassVar[bool] = True


OptimizerConfig = DistroOptimizer | AdamWOptimizer | SparseLoCoOptimizer | DummyOptimizer
OPTIMIZER = ExternallyTagged(DistroOptimizer, AdamWOptimizer, SparseLoCoOptimizer,
                             DummyOptimizer)


# ----------------------------------------------------------------- checkpoints


class _HubRepo(Variant):
    repo_id: Annotated[StrictStr, Field(min_length=1)]
    revision: StrictStr | None = None

    _check_lengths = field_validator("repo_id", "revision")(
        lambda value: value if value is None else max_bytes(STRING_MAX_BYTES)(value)
    )


class _GcsRepo(Variant):
    bucket: Annotated[StrictStr, Field(min_length=1)]
    prefix: StrictStr | None = None

    _check_lengths = field_validator("bucket", "prefix")(
        lambda value: value if value is None else max_bytes(STRING_MAX_BYTES)(value)
    )


class DummyCheckpoint(_HubRepo):
    """A model built by every client, not downloaded (client_image/training/dummy_model.py):
    repo_id, a local directory's config.json, or empty (as Psyche's config/test) for a
    small built-in Llama."""

    TAG: ClassVar[str] = "Dummy"
    repo_id: StrictStr


class HubCheckpoint(_HubRepo):
    TAG: ClassVar[str] = "Hub"


class P2PCheckpoint(_HubRepo):
    """Fetch the model from peers of the previous epoch (set by the coordinator). repo_id
    may be empty: that of a Dummy run started from the built-in model."""

    TAG: ClassVar[str] = "P2P"
    repo_id: StrictStr


class GcsCheckpoint(_GcsRepo):
    TAG: ClassVar[str] = "Gcs"


class P2PGcsCheckpoint(_GcsRepo):
    TAG: ClassVar[str] = "P2PGcs"


Checkpoint = DummyCheckpoint | HubCheckpoint | P2PCheckpoint | GcsCheckpoint | P2PGcsCheckpoint
CHECKPOINT = ExternallyTagged(
    DummyCheckpoint, HubCheckpoint, P2PCheckpoint, GcsCheckpoint, P2PGcsCheckpoint,
    rejected={"Ephemeral": "a run must start from a Hub, Gcs or Dummy checkpoint"},
)


Architecture = Literal["HfLlama", "HfDeepseek", "HfAuto", "Torchtitan"]
DataType = Literal["Pretraining", "Finetuning"]
