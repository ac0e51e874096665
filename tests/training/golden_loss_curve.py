"""The golden loss curve: two DisTrO peers, 8 steps of the bundled tiny Llama on the
bundled data, for a fixed seed (tests/training/golden/distro_tiny_llama.json).

    .venv/bin/python tests/training/golden_loss_curve.py           # rewrites the golden file
    .venv/bin/python tests/training/golden_loss_curve.py --print   # prints the curve instead

Recorded and checked under the pinned CPU numerics of reproducible_numerics.py, so that it
holds on any x86 CPU (the eighth loss moved by 0.006 between two machines without them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden" / "distro_tiny_llama.json"
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from reproducible_numerics import reproducible_numerics_active, run_reproducibly  # noqa: E402
from training_assets import TINY_MODEL, TRAIN_DATA  # noqa: E402

from client_image.training.simulate import Simulation, SimulationConfig  # noqa: E402
from coordinator.config import ConstantLR, DistroOptimizer  # noqa: E402

DISTRO = DistroOptimizer(
    compression_decay=0.999, compression_topk=8, compression_chunk=64, quantize_1bit=True,
    clip_grad_norm=1.0, weight_decay=0.1,
)


def losses() -> list[float]:
    config = SimulationConfig(
        model=TINY_MODEL, data=TRAIN_DATA, steps=8, total_batch=4, micro_batch=1, peers=2,
        seq_len=32, seed=3, distro=DISTRO,
        lr_schedule=ConstantLR(base_lr=6e-3, warmup_init_lr=0.0, warmup_steps=4),
    )
    return [round(report.loss, 5) for report in Simulation(config).run()]


if __name__ == "__main__":
    if not reproducible_numerics_active():
        print(run_reproducibly(Path(__file__), *sys.argv[1:]), end="")
    elif "--print" in sys.argv[1:]:
        print(json.dumps(losses()))
    else:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({"losses": losses()}, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
