"""Running a recording under CPU numerics that do not depend on the machine's CPU.

A recorded figure (payload hashes, a golden loss curve) is only worth comparing with when
the same code gives the same bits on every machine that runs the tests. By default it does
not: ATen picks AVX2 or AVX-512 kernels, MKL picks its own code path, and the thread count
changes reduction orders, so the last bits of a forward/backward differ between CPUs, and
DisTrO's sign quantization turns that into other payloads (seen here: 0.006 in the golden
curve's eighth loss between two x86 machines). Pinned to ATen's default (non-vector)
kernels, MKL's conditional numerical reproducibility (MKL_CBWR=COMPATIBLE) and one thread,
the recordings came out identical with MKL limited to SSE4.2, AVX2 or AVX-512, so a
recording made on one machine holds on another. These settings are read when torch loads,
hence a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPRODUCIBLE_NUMERICS_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def reproducible_numerics_active() -> bool:
    return all(os.environ.get(name) == value for name, value in REPRODUCIBLE_NUMERICS_ENV.items())


def run_reproducibly(script: Path, *args: str, timeout_s: float = 600) -> str:
    """`script`'s standard output, run by this Python under the pinned numerics."""
    done = subprocess.run([sys.executable, str(script), *args], check=False, capture_output=True,
                          text=True,
                          env={**os.environ, **REPRODUCIBLE_NUMERICS_ENV}, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stderr[-4000:]}")
    return done.stdout
