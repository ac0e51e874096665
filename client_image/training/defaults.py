"""The optimizer settings every simulation, benchmark and test starts from: one place.

DISTRO_PSYCHE is what Psyche's own configs use and what config/local-testnet/state.toml
holds (tests/training/test_optimizer_defaults.py checks they agree). DISTRO_TUNED and
SPARSELOCO are the settings bench/optimizers.py measured on the bundled tiny model
(docs/distro.md, "Tuning"; docs/sparseloco.md).
"""

from __future__ import annotations

from coordinator.config import DistroOptimizer, SparseLoCoOptimizer

DISTRO_PSYCHE = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=None,
)
DISTRO_TUNED = DISTRO_PSYCHE.model_copy(update={"compression_decay": 0.95})
SPARSELOCO = SparseLoCoOptimizer(
    inner_steps=12, inner_lr=2e-3, topk_density=1 / 128, chunk=64, quant_bits=2,
    error_decay=0.95, outer_lr=1.0, clip_grad_norm=1.0,
)
DISTRO_LR = 2e-3  # peak rates of bench/optimizers.py's warm-up + cosine schedule
ADAMW_LR = 2e-3
