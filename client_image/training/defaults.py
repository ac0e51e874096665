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
# Measured on the tiny model over 480 steps (bench/results/distro_frontier.md): a faster
# momentum decay with twice the rate and a longer warm-up; everything that changes the
# bytes or the wire stays Psyche's.
DISTRO_TUNED = DISTRO_PSYCHE.model_copy(update={"compression_decay": 0.95})
DISTRO_TUNED_LR = 4e-3
DISTRO_TUNED_WARMUP = 0.15  # of the steps (the others warm up over 5%)
# 8 inner steps, 2.5% of each 32 x 32 block at 2 bits (about 1,070 times fewer bytes per
# token than a dense fp32 gradient), error decay 0.8, outer step 2.5: the best of the
# settings tried against DiLoCo at the same H, 1.016 x its loss over 3 seeds (issue 34,
# bench/results/optimizers_sparseloco_best_2cores.txt).
SPARSELOCO = SparseLoCoOptimizer(
    inner_steps=8, inner_lr=2e-3, topk_density=0.025, chunk=32, quant_bits=2,
    error_decay=0.8, outer_lr=2.5, clip_grad_norm=1.0,
)
DISTRO_LR = 2e-3  # peak rates of bench/optimizers.py's warm-up + cosine schedule
ADAMW_LR = 2e-3  # the best of 1e-3, 2e-3, 4e-3, 8e-3 for the tiny model
