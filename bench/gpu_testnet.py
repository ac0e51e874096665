"""A local testnet whose clients share one device: a coordinator and N `psyche-client train`
processes (real TCP, real iroh on loopback) training a model for a few rounds. Prints the
run's summary, then ONE JSON line.

    python -m bench.gpu_testnet [--model 125m|tiny] [--clients 2] [--rounds 3]
        [--device cuda] [--dtype bf16] [--timeout 240]

The config is config/local-testnet's (bundled data served by the coordinator's data
server) with the model replaced (bench/gpu_models.py: the 125 M Llama gets random weights,
saved to the work folder), `total_steps` = --rounds, every client needed from the start,
phases with room for a 125 M model (rounds up to 60 s, a 15 s cooldown to checkpoint),
and no learning-rate warm-up (2e-3 from the first round). Every client gets `--device` and `--dtype`.

JSON fields: testnet_clients_identical (every client's last checkpoint has the same
SHA-256), testnet_loss_fell (the clients' mean loss at the last trained step below the
first's), testnet_first_loss, testnet_last_loss, testnet_steps, testnet_wall_s,
testnet_error (null when the run finished).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from bench.gpu_models import model_dir
from coordinator import load_state_file
from coordinator.config import CosineLR, HubCheckpoint
from local_testnet.config_variant import write_config_variant
from local_testnet.testnet import Testnet, TestnetOptions, run_headless
from psyche_common.local_ports import free_ports

ROOT = Path(__file__).resolve().parents[1]


def write_config(directory: Path, model: Path, rounds: int, clients: int, data_port: int) -> Path:
    config = write_config_variant(directory, data_port, total_steps=rounds,
                                  init_min_clients=clients, min_clients=clients,
                                  # upper bounds (a phase ends once every client is
                                  # done), but the cooldown is a fixed window: 125 M
                                  # checkpoints need more than the tiny model's 5 s
                                  warmup_time=120, epoch_time=300, max_round_train_time=60,
                                  cooldown_time=15)
    state = load_state_file(config / "state.toml")
    # No warm-up: the first round's results already move the weights (a 3-round run has
    # only the rounds after it to show the loss falling).
    schedule = CosineLR(base_lr=2e-3, warmup_init_lr=2e-3, warmup_steps=1, total_steps=rounds,
                        final_lr=2e-4)
    llm = state.model.model_copy(update={
        "checkpoint": HubCheckpoint(repo_id=str(model.resolve())), "lr_schedule": schedule})
    state = state.model_copy(update={"model": llm})
    (config / "state.toml").write_text(state.to_toml())
    load_state_file(config / "state.toml")  # still a valid config
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="125m", choices=("125m", "tiny"))
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model = model_dir(args.model, work / "models")
        server_port, data_port = free_ports(2)
        config = write_config(work / "config", model, args.rounds, args.clients, data_port)
        testnet = Testnet(TestnetOptions(
            num_clients=args.clients, config_path=config, work_dir=work / "run",
            server_port=server_port, metrics_base_port=None, timeout_s=args.timeout,
            client_args=["--device", args.device, "--dtype", args.dtype,
                         "--torch-threads", "2"]))
        summary = asyncio.run(run_headless(testnet))
        if summary["error"] is not None:
            for log in sorted((work / "run").glob("*.log")):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {log.name} (last lines)\n" + "\n".join(tail), file=sys.stderr)
    print(json.dumps(summary))
    first, last = summary["first_loss"], summary["last_loss"]
    # A run that ended in an error (a client exited: torch missing, out of memory) has no
    # verdict: null, not false, as when the part is killed at its time limit.
    failed = summary["error"] is not None
    print(json.dumps({
        "testnet_clients_identical": None if failed else bool(summary["clients_identical"]),
        "testnet_loss_fell": None if first is None or last is None else last < first,
        "testnet_first_loss": first, "testnet_last_loss": last,
        "testnet_steps": summary["steps"], "testnet_checkpoints_compared":
            summary["checkpoints_compared"], "testnet_wall_s": summary["wall_s"],
        "testnet_error": summary["error"],
    }))
    if failed:
        sys.exit(1)  # the suite records the part as failed, with this output's last lines


if __name__ == "__main__":
    main()
