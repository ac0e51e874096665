"""bench/optimizers.py on one device within a time budget: every method it knows, one
process each at once, as many steps as fit, the same steps (tokens) for every method.
Prints its progress, then ONE JSON line.

    python -m bench.gpu_learn [--model 125m|tiny] [--device cuda] [--budget-s 400]
        [--probe-steps 16] [--steps N] [--methods M ...] [-- extra optimizers.py arguments]

1. probe: each method runs --probe-steps steps (all at once, as in step 2) and reports its
   training seconds; a step's cost is the slowest method's seconds per step, the process
   set-up (model load, data, validation) what the probe took beyond its training.
2. run: steps = what fits the rest of the budget at that cost (a multiple of SparseLoCo's
   inner steps), every method at once, 4 simulated workers (optimizers.py's --peers).
3. summary: bench/optimizers.py --from-jsonl over the outcomes.
--steps N skips the probe (the --smoke call: a fixed, tiny run); --methods a subset.

Bytes per token, per worker: what a worker sends per token it trains; AdamW's is the
dense fp32 gradient all-reduce baseline, 4 x params / tokens per worker per step (the
dense figure optimizers.py divides by for its bytes ratios).

JSON fields: methods, learn_steps, learn_tokens_per_method, params, <method>_val_loss,
<method>_loss_ratio (over AdamW's), <method>_bytes_per_token, <method>_bytes_ratio (over
dense fp32 AdamW's), <method>_wall_s, sparseloco_vs_diloco, distro_vs_demo,
distro_tuned_vs_demo (when both methods of the pair finished), learn_errors (per method
that did not finish, why).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_models import NAMES, model_dir

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ROOT / "bench" / "optimizers.py"

FALLBACK_METHODS = ("adamw", "distro", "distro_tuned", "sparseloco")
FALLBACK_INNER_STEPS = 16
FALLBACK_PAIRS = ("sparseloco_vs_diloco", "distro_vs_demo", "distro_tuned_vs_demo")


def known_methods() -> tuple[str, ...]:
    """optimizers.py's METHODS, read from its source (no torch import in this process)."""
    found = re.search(r"^METHODS\s*=\s*(\(.*?\))", OPTIMIZERS.read_text(), re.M | re.S)
    return tuple(ast.literal_eval(found.group(1))) if found else FALLBACK_METHODS


def known_pairs() -> tuple[str, ...]:
    """The names of optimizers.py's PAIRS (sparseloco_vs_diloco, ...), read from its source."""
    found = re.search(r"^PAIRS\s*=\s*(\{.*?\})$", OPTIMIZERS.read_text(), re.M | re.S)
    return tuple(ast.literal_eval(found.group(1))) if found else FALLBACK_PAIRS


def inner_steps(extra: list[str]) -> int:
    if "--inner-steps" in extra:
        return int(extra[extra.index("--inner-steps") + 1])
    found = re.search(r"inner_steps\s*=\s*(\d+)",
                      (ROOT / "client_image" / "training" / "defaults.py").read_text())
    return int(found.group(1)) if found else FALLBACK_INNER_STEPS


def steps_that_fit(seconds_per_step: float, setup_s: float, left_s: float, inner: int,
                   max_steps: int) -> int:
    """The most steps (a multiple of `inner`, at least `inner`) whose run fits `left_s`:
    a process's set-up with a fifth of margin, 10 s for the summary, and 15% slack on the
    probe's step time (a longer run evaluates and checkpoints nothing more, but the GPU's
    clocks and the processes' overlap vary)."""
    usable = left_s - 1.2 * setup_s - 10
    fit = int(usable / max(seconds_per_step, 1e-6) / 1.15) // inner * inner
    return max(inner, min(max_steps, fit) // inner * inner)


def run_all(methods: tuple[str, ...], steps: int, common: list[str], folder: Path,
            timeout_s: float) -> tuple[dict[str, dict[str, float]], dict[str, str], float]:
    """Every method as its own process at once: (outcome per method, error per method,
    seconds the slowest process took)."""
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    processes = {}
    for method in methods:
        log = (folder / f"{method}.log").open("w")
        processes[method] = subprocess.Popen(
            [sys.executable, "-m", "bench.optimizers", *common, "--steps", str(steps), "--methods",
             method, "--seeds", "0", "--jsonl", str(folder / f"{method}.jsonl")],
            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    outcomes, errors = {}, {}
    for method, process in processes.items():
        left = max(1.0, timeout_s - (time.monotonic() - started))
        try:
            code = process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            errors[method] = f"cut at {timeout_s:.0f} s ({steps} steps)"
            continue
        records = folder / f"{method}.jsonl"
        if code != 0 or not records.exists():
            tail = (folder / f"{method}.log").read_text(errors="replace").strip().splitlines()
            errors[method] = f"exit {code}: {tail[-1] if tail else 'no output'}"
            continue
        outcomes[method] = json.loads(records.read_text().splitlines()[-1])
    return outcomes, errors, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="125m", choices=NAMES)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument("--probe-steps", type=int, default=None,
                        help="default: SparseLoCo's inner steps")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=None, help="fixed steps, no probe")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="default: every method bench/optimizers.py knows")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    deadline = time.monotonic() + args.budget_s
    methods = tuple(args.methods) if args.methods else known_methods()
    inner = inner_steps(extra)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        source = model_dir(args.model, folder / "models")
        common = ["--model", str(source), "--device", args.device, "--threads", "1", "--grid-points", "1",
                  "--max-epochs", "1000", *extra]
        if args.steps is not None:
            steps = args.steps
        else:
            probe_steps = args.probe_steps or inner
            probe, errors, probe_s = run_all(methods, probe_steps, common, folder / "probe",
                                             deadline - time.monotonic())
            if errors or not probe:
                print(json.dumps({"methods": list(methods), "learn_errors": errors,
                                  "learn_steps": None}))
                raise SystemExit(f"the probe of {probe_steps} steps failed: {errors}")
            slowest = max(o["wall_s"] for o in probe.values())
            per_step, setup = slowest / probe_steps, max(probe_s - slowest, 1.0)
            left = deadline - time.monotonic()
            steps = steps_that_fit(per_step, setup, left, inner, args.max_steps)
            print(f"probe: {probe_steps} steps, slowest {per_step:.3f} s/step, set-up "
                  f"{setup:.0f} s: {steps} steps fit the {left:.0f} s left", flush=True)
        outcomes, errors, _ = run_all(methods, steps, common, folder / "run",
                                      deadline - time.monotonic())
        if not outcomes:
            print(json.dumps({"methods": list(methods), "learn_errors": errors,
                              "learn_steps": steps}))
            raise SystemExit(f"no method finished {steps} steps: {errors}")
        summary_run = subprocess.run(
            [sys.executable, "-m", "bench.optimizers", "--model", str(source), "--from-jsonl",
             *(str(folder / "run" / f"{m}.jsonl") for m in outcomes)],
            capture_output=True, text=True, check=True, cwd=ROOT)
        summary = json.loads(summary_run.stdout.strip().splitlines()[-1])
    per_worker_tokens = summary["total_batch"] // summary["peers"] * summary["seq_len"]
    dense_per_token = 4 * summary["params"] / per_worker_tokens
    report: dict[str, object] = {
        "methods": list(methods), "learn_steps": steps,
        "learn_tokens_per_method": steps * summary["total_batch"] * summary["seq_len"],
        "params": summary["params"], "peers": summary["peers"], "seq_len": summary["seq_len"],
        "total_batch": summary["total_batch"],
    }
    for method, outcome in outcomes.items():
        report[f"{method}_val_loss"] = outcome["val_loss"]
        report[f"{method}_wall_s"] = outcome["wall_s"]
        ratio = summary.get(f"{method}_loss_ratio")
        if method != "adamw" and ratio is not None:
            report[f"{method}_loss_ratio"] = ratio
        bytes_ratio = outcome.get("bytes_ratio")
        report[f"{method}_bytes_per_token"] = round(
            dense_per_token / bytes_ratio if bytes_ratio else dense_per_token, 2)
        report[f"{method}_bytes_ratio"] = bytes_ratio if method != "adamw" else 1.0
    # optimizers.py's ratios against the dense baselines (sparseloco_vs_diloco, ...),
    # present when both methods of a pair finished
    for pair in known_pairs():
        if pair in summary:
            report[pair] = summary[pair]
    report["learn_errors"] = errors
    for key, value in report.items():
        print(f"{key:30s} {value}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
