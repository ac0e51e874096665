"""The GPU suite's two calls, each its parts as child processes, within a time budget.
Run through bench/gpu_suite.sh (it picks the Python and carried wheels); prints each part's
outcome, then ONE JSON line, written to <results>/gpu_suite_<call>_<device>_<commit>.json
and, when $OUT is set (the device machine), copied there with the profiler table and a log.

    python -m bench.gpu_suite speed|learn [--smoke] [--commit ID] [--budget-s S]
        [--results-dir DIR]

speed (docs/gpu_suite.md has every field):
    plan      bench/gpu_plan.py: the device, and the micro-batch and activation
              checkpointing the memory plan chooses for the 1 B Llama (seq 2048, batch 16)
    train     bench/train_step.py --speed-only on it, bf16, 16 peers' results applied per
              step, with a torch.profiler table (<json name>_profile.txt)
    apply     bench/gpu_apply.py: 64 peers' results applied to the 1 B model
    replay    bench/gpu_replay.py: an honest bf16 trainer vs a replay at another micro-batch
    testnet   bench/gpu_testnet.py: 2 clients sharing the device, 125 M Llama, bf16, 3 rounds
    docker    the `-cuda` client image, if this machine has Docker and the image: does torch
              inside it see the GPU
learn: bench/gpu_learn.py (bench/optimizers.py, 125 M Llama, 4 workers, every method).

Parts of one group run at once (replay, testnet and docker: no timing figure among them);
groups run in order. A part that fails, or that the budget leaves no time for, leaves its
fields null and says why in `errors`; the call still prints and writes its line.
--smoke: the tiny model on the CPU, small sizes: the same code paths in seconds (tests).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
GIB_PER_MB = 1 / 1024
# What bench/gpu_wheels.sh brings to the device (its image has torch, transformers & co.).
CARRIED_MODULES = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection",
                   "pydantic_settings", "dotenv", "iroh", "blake3", "bsdiff4", "tomli_w",
                   "cryptography", "cffi", "_cffi_backend", "pycparser",
                   "typing_extensions", "typer", "click"}
DEVICE_FIELDS = ("device_name", "device_slug", "torch", "cuda", "device_memory_gib")


@dataclass
class Part:
    name: str
    argv: list[str]
    timeout_s: float
    group: int
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    figures: dict[str, Any] | None
    error: str | None
    seconds: float
    log: str


def bench(script: str, *args: object) -> list[str]:
    # Each benchmark runs as a module from the repository root (Popen cwd=ROOT): the root is
    # then on the import path, so the packages import without an install.
    return [sys.executable, "-m", f"bench.{Path(script).stem}", *(str(a) for a in args)]


def why_failed(code: int | None, output: str, timeout_s: float) -> str:
    """One line: the missing module, the last exception, or the exit code."""
    missing = re.findall(r"No module named '([^']+)'", output)
    if missing:
        module = missing[-1].split(".")[0]
        hint = ("on the device: run `bench/gpu_suite.sh wheels` here and carry .whl"
                if module in CARRIED_MODULES else f"not in {sys.executable}'s packages")
        return f"missing Python module {missing[-1]!r} ({hint})"
    if code is None:
        return f"timed out after {timeout_s:.0f} s"
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Exit)\b", line)
              or "Error:" in line]
    return f"exit {code}: {(errors or lines or ['no output'])[-1][:300]}"


def last_json(output: str) -> dict[str, Any] | None:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def run_group(parts: list[Part], deadline: float) -> dict[str, Outcome]:
    """The parts at once, each bounded by its timeout and by the call's deadline."""
    started = time.monotonic()
    running = {}
    outcomes = {}
    for part in parts:
        left = deadline - started
        if left < 15:
            outcomes[part.name] = Outcome(None, "skipped: the call's time budget is spent", 0, "")
            continue
        part.timeout_s = min(part.timeout_s, left)
        print(f"[{part.name}] {' '.join(part.argv[1:])} (up to {part.timeout_s:.0f} s)",
              flush=True)
        running[part.name] = (part, subprocess.Popen(
            part.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **part.env}, cwd=ROOT, start_new_session=True))
    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        ending = {name: pool.submit(finish, part, process, started)
                  for name, (part, process) in running.items()}
        outcomes.update({name: future.result() for name, future in ending.items()})
    return outcomes


def finish(part: Part, process: subprocess.Popen[str], started: float) -> Outcome:
    """Wait for one part (killing its whole process group at its timeout): its outcome."""
    try:
        output, _ = process.communicate(
            timeout=max(1.0, part.timeout_s - (time.monotonic() - started)))
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)  # the part and whatever it started (testnet clients)
        output, _ = process.communicate()
        code = None
    seconds = time.monotonic() - started
    figures = last_json(output) if code == 0 else None
    error = None if figures is not None else why_failed(code, output, part.timeout_s)
    print(f"[{part.name}] {'ok' if error is None else error} ({seconds:.0f} s)", flush=True)
    return Outcome(figures, error, seconds, output)


def docker_check() -> dict[str, Any]:
    """Does torch inside the `-cuda` client image see the GPU (where Docker is at hand)?"""
    docker = shutil.which("docker")
    if docker is None:
        return {"docker": "no docker on this machine", "docker_image_sees_gpu": None}
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30,
                          check=False)
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        return {"docker": f"docker is installed but its daemon does not answer: {reason}",
                "docker_image_sees_gpu": None}
    listed = subprocess.run([docker, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                            capture_output=True, text=True, timeout=30, check=False)
    images = [i for i in listed.stdout.split() if i.endswith("-cuda")]
    if not images:
        return {"docker": "docker runs, but no `-cuda` client image is here (none can be "
                          "pulled without a network)", "docker_image_sees_gpu": None}
    probe = subprocess.run(
        [docker, "run", "--rm", "--gpus", "all", images[0], "python", "-c",
         "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"],
        capture_output=True, text=True, timeout=180, check=False)
    seen = probe.stdout.strip().split()
    return {"docker": f"{images[0]}: {(probe.stdout or probe.stderr).strip()[-200:]}",
            "docker_image_sees_gpu": bool(seen) and seen[0] == "True"}


def plan_argv(smoke: bool, model: str, seq_len: int, batch: int, peers: int) -> list[str]:
    """bench/gpu_plan.py for the call's model (the tiny one on the CPU, --smoke)."""
    if smoke:
        return bench("gpu_plan.py", "--model", "tiny", "--seq-len", 32, "--batch", 2,
                     "--peers", 2, "--device", "cpu", "--memory-gib", 0.5)
    return bench("gpu_plan.py", "--model", model, "--seq-len", seq_len, "--batch", batch,
                 "--peers", peers, "--device", "cuda")


def speed_parts(smoke: bool, device: str, plan: dict[str, Any] | None,
                profile: Path) -> list[Part]:
    """train, apply, replay and testnet, sized for the device (or --smoke)."""
    micro = (plan or {}).get("micro_batch", 1 if smoke else 4)
    checkpointing = ["--activation-checkpointing"] if (plan or {}).get(
        "activation_checkpointing") else []
    if smoke:
        return [
            Part("train", bench("train_step.py", "--model", ROOT / "assets" / "tiny-llama",
                                "--device", device, "--dtype", "bf16", "--speed-only",
                                "--steps", 1, "--batch", 2, "--micro-batch", micro,
                                "--seq-len", 32, "--peers", 2, "--profile", profile,
                                *checkpointing), 240, 1),
            Part("apply", bench("gpu_apply.py", "--model", "tiny", "--peers", 4,
                                "--device", device), 120, 2),
            Part("replay", bench("gpu_replay.py", "--model", "tiny", "--device", device,
                                 "--steps", 3, "--batch", 4, "--micro-batch", 2,
                                 "--replay-micro-batch", 1, "--seq-len", 32), 120, 3),
            # 5 rounds: the tiny model's loss falls by ~0.1 there, by less than a batch's
            # noise in 3 (the 125 M model's falls at once)
            Part("testnet", bench("gpu_testnet.py", "--model", "tiny", "--device", device,
                                  "--dtype", "fp32", "--rounds", 5, "--timeout", 150), 180, 3),
        ]
    return [
        Part("train", bench("train_step.py", "--model", ROOT / "config" / "models" / "llama-1b",
                            "--device", device, "--dtype", "bf16", "--speed-only",
                            "--steps", 6, "--batch", 16, "--micro-batch", micro,
                            "--seq-len", 2048, "--peers", 16, "--profile", profile,
                            *checkpointing), 200, 1),
        Part("apply", bench("gpu_apply.py", "--model", "llama-1b", "--peers", 64,
                            "--device", device), 120, 2),
        Part("replay", bench("gpu_replay.py", "--model", "125m", "--device", device), 150, 3),
        Part("testnet", bench("gpu_testnet.py", "--model", "125m", "--device", device,
                              "--dtype", "bf16", "--rounds", 3, "--timeout", 170), 190, 3),
    ]


def speed(args: argparse.Namespace, deadline: float, report: dict[str, Any],
          outcomes: dict[str, Outcome], profile_of: Any) -> list[Path]:
    device = "cpu" if args.smoke else "cuda"
    argv = plan_argv(args.smoke, "llama-1b", 2048, 16, 16)
    outcomes.update(run_group([Part("plan", argv, 90, 0)], deadline))
    plan = outcomes["plan"].figures
    if plan is not None:
        report.update({k: plan[k] for k in DEVICE_FIELDS})
        report.update({"micro_batch": plan["micro_batch"],
                       "activation_checkpointing": plan["activation_checkpointing"],
                       "plan_max_micro_batch": plan["max_micro_batch"]})
    profile = profile_of(report.get("device_slug", "unknown"))
    parts = speed_parts(args.smoke, device, plan, profile)
    for group in sorted({p.group for p in parts}):
        members = [p for p in parts if p.group == group]
        if group == 3:
            members.append(Part("docker", [sys.executable, "-m", "bench.gpu_suite", "docker-check"], 200, 3))
        outcomes.update(run_group(members, deadline))
    train = (outcomes["train"].figures or {})
    report.update({
        "model": "tiny" if args.smoke else "llama-1b",
        "seq_len": train.get("seq_len"), "batch": train.get("batch"),
        "peers": train.get("peers"),
        "tokens_per_s": train.get("tokens_per_s"), "mfu": train.get("mfu"),
        "distro_overhead_pct": train.get("distro_overhead_pct"),
        "peak_mem_gib": (round(train["peak_mem_mb"] * GIB_PER_MB, 3)
                         if train.get("peak_mem_mb") is not None else None),
        "plan_over_peak": train.get("plan_over_peak"),
    })
    apply = outcomes["apply"].figures or {}
    report.update({"apply_s_64": apply.get("apply_s"),
                   "apply_peak_extra_gib_64": apply.get("apply_peak_extra_gib"),
                   "apply_peers": apply.get("peers")})
    testnet = outcomes["testnet"].figures or {}
    report.update({"testnet_clients_identical": testnet.get("testnet_clients_identical"),
                   "testnet_loss_fell": testnet.get("testnet_loss_fell"),
                   "testnet_steps": testnet.get("testnet_steps"),
                   "testnet_first_loss": testnet.get("testnet_first_loss"),
                   "testnet_last_loss": testnet.get("testnet_last_loss")})
    replay = outcomes["replay"].figures or {}
    for name in ("gpu_replay_jaccard", "gpu_replay_hamming", "gpu_replay_manhattan"):
        report[name] = replay.get(name)
    report.update(outcomes["docker"].figures or {"docker": outcomes["docker"].error,
                                                 "docker_image_sees_gpu": None})
    return [profile] if profile.exists() else []


def learn(args: argparse.Namespace, deadline: float, report: dict[str, Any],
          outcomes: dict[str, Outcome]) -> None:
    outcomes.update(run_group([Part("plan", plan_argv(args.smoke, "125m", 128, 16, 4), 90, 0)],
                              deadline))
    plan = outcomes["plan"].figures
    if plan is not None:
        report.update({k: plan[k] for k in DEVICE_FIELDS})
    left = deadline - time.monotonic()
    argv = (bench("gpu_learn.py", "--model", "tiny", "--device", "cpu", "--budget-s",
                  left - 10, "--steps", 2, "--methods", "adamw", "distro", "--",
                  "--inner-steps", 2, "--val-samples", 16, "--total-batch", 8,
                  "--micro-batch", 4, "--seq-len", 64)
            if args.smoke else bench("gpu_learn.py", "--model", "125m", "--device", "cuda",
                                     "--budget-s", left - 15))
    outcomes.update(run_group([Part("learn", argv, left - 5, 1)], deadline))
    figures = outcomes["learn"].figures or {}
    report.update({"model": "tiny" if args.smoke else "125m", **figures})


def main() -> None:
    if sys.argv[1:] == ["docker-check"]:  # the speed call's docker part, as a child
        print(json.dumps(docker_check()))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("call", choices=("speed", "learn"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="the whole call's seconds (parts left without time are skipped)")
    parser.add_argument("--results-dir", type=Path, default=BENCH / "results")
    args = parser.parse_args()
    started = time.monotonic()
    deadline = started + args.budget_s
    report: dict[str, Any] = {"call": args.call, "smoke": args.smoke, "commit": args.commit,
                              "setup": os.environ.get("GPU_SUITE_SETUP_NOTE") or None,
                              "python": sys.executable}
    outcomes: dict[str, Outcome] = {}
    commit = re.sub(r"[^A-Za-z0-9_.-]", "-", args.commit)

    def stem(slug: str) -> str:
        return f"gpu_suite_{args.call}_{slug}_{commit}"

    extra_files: list[Path] = []
    if args.call == "speed":
        extra_files = speed(args, deadline, report, outcomes,
                            lambda slug: args.results_dir / f"{stem(slug)}_profile.txt")
    else:
        learn(args, deadline, report, outcomes)
    report["errors"] = {name: o.error for name, o in outcomes.items() if o.error}
    report["seconds"] = {name: round(o.seconds, 1) for name, o in outcomes.items()}
    report["wall_s"] = round(time.monotonic() - started, 1)
    line = json.dumps(report)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    result = args.results_dir / f"{stem(report.get('device_slug', 'unknown'))}.json"
    result.write_text(line + "\n")
    out = os.environ.get("OUT")
    if out:
        log = Path(out) / f"{result.stem}_log.txt"
        log.write_text("".join(f"===== {name} ({o.seconds:.0f} s, {o.error or 'ok'})\n{o.log}\n"
                               for name, o in outcomes.items()))
        for path in [result, *extra_files]:
            shutil.copy(path, Path(out) / path.name)
    print(f"wrote {result}" + (f" (and to {out})" if out else ""))
    print(line)


if __name__ == "__main__":
    main()
