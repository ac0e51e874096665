"""The ranks of one client: the leader (rank 0, the client process) and its followers.

A client with D x T > 1 runs one process per rank. Only the leader talks to the run
(coordinator, peers); every call that touches the model is a *command* the leader
broadcasts to all ranks (a gloo group, pickled) and then runs itself, so that each rank
enters the same collectives in the same order:

    build(spec)              the model from the leader's config + full state dict,
                             parallelized over the mesh, with a ShardedDistroTrainer
    train(step, batch, …)    every rank trains its share; all return the same payload
    apply(step, payloads)    every rank decodes the peers' payloads and applies them
    idle(step)               a step the client does not train: weight decay only
    round_to_bf16()          the cooldown's rounding, on each rank's shards
    full_state_dict()        all-gathered bf16 weights (the leader saves / shares them)
    stop()

Followers on the leader's host are started by the leader; followers on other hosts are
*sidecars* (`psyche-client sidecar`, Psyche's PSYCHE_MAIN_HOST / PSYCHE_WORLD_SIZE /
PSYCHE_START_RANK): they join the same TCP rendezvous at the main host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from client_image.training.parallel import (
    ParallelDims,
    ParallelismError,
    build_mesh,
    init_process_group,
    parallelize_llama,
)
from client_image.training.precision import ComputeDType, enable_activation_checkpointing
from client_image.training.sharded import ShardedDistroTrainer, full_tensor
from client_image.training.trainer import TrainStepOutput
from coordinator.config import DistroOptimizer, LRSchedule

log = logging.getLogger(__name__)

DEFAULT_MAIN_PORT = 29500
PING_INTERVAL_S = 300.0  # an idle leader broadcasts a no-op this often (parallel.py)


class RankFailed(RuntimeError):
    """A rank of this client is gone: the model it held a part of is lost."""


@dataclass(frozen=True)
class RankSetup:
    """Where the ranks of one client meet, and how many run on this host."""

    dims: ParallelDims
    main_host: str = "127.0.0.1"
    main_port: int = 0  # 0: a free port (every rank on this host)
    local_ranks: int | None = None  # ranks 0..n-1 here; the rest are sidecars (None: all)

    @property
    def here(self) -> int:
        return self.dims.world_size if self.local_ranks is None else self.local_ranks

    def __post_init__(self) -> None:
        if not 1 <= self.here <= self.dims.world_size:
            raise ParallelismError(f"{self.here} local ranks for a world of {self.dims.world_size}")
        if self.here < self.dims.world_size and self.main_port == 0:
            raise ParallelismError("sidecars need a fixed rendezvous port (--main-port)")


@dataclass
class BuildSpec:
    """Everything a rank needs to build its part of the model (pickled to followers)."""

    config_json: str
    state: dict[str, torch.Tensor]
    optimizer: DistroOptimizer
    lr_schedule: LRSchedule
    cold_start_warmup_steps: int
    start_step: int
    dims: ParallelDims
    compute: ComputeDType
    micro_batch_size: int
    activation_checkpointing: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class RankExecutor:
    """What one rank does for each command (the same code on every rank)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.model: torch.nn.Module | None = None
        self.trainer: ShardedDistroTrainer | None = None

    def build(self, spec: BuildSpec) -> None:
        import json
        import tempfile
        from pathlib import Path

        from transformers import AutoConfig, AutoModelForCausalLM

        with tempfile.TemporaryDirectory(prefix="psyche-rank-") as scratch:
            (Path(scratch) / "config.json").write_text(spec.config_json)
            config = AutoConfig.from_pretrained(scratch)
        json.loads(spec.config_json)  # the leader sent a config it could read
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(spec.state, strict=False)
        if getattr(config, "tie_word_embeddings", False):
            model.tie_weights()
        model.to(self.device)
        model.train()
        mesh = build_mesh(spec.dims, torch.device(self.device).type)
        parallelize_llama(model, mesh, spec.compute)
        if spec.activation_checkpointing:
            enable_activation_checkpointing(model)
        self.model = model
        self.trainer = ShardedDistroTrainer(
            model, spec.optimizer, spec.lr_schedule, mesh=mesh,
            micro_batch_size=spec.micro_batch_size,
            cold_start_warmup_steps=spec.cold_start_warmup_steps, start_step=spec.start_step,
            compute=spec.compute)

    def train(self, step: int, batch: torch.Tensor, batch_id: tuple[int, int],
              cold_start: bool) -> TrainStepOutput:
        assert self.trainer is not None
        return self.trainer.train(step, batch, batch_id=batch_id, cold_start=cold_start)

    def apply(self, step: int, payloads: list[bytes]) -> int:
        assert self.trainer is not None
        return self.trainer.apply_payloads(step, payloads)

    def idle(self, step: int) -> None:
        assert self.trainer is not None
        self.trainer.idle(step)

    def reset_delta(self) -> None:
        assert self.trainer is not None
        self.trainer.reset_delta()

    @torch.no_grad()
    def round_to_bf16(self) -> None:
        from client_image.training.model import round_to_bf16_

        assert self.model is not None
        round_to_bf16_(self.model)

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """bf16 CPU copies of every weight, whole; one all-gather per distinct tensor (a
        tied weight stays one tensor under its two names)."""
        assert self.model is not None
        gathered: dict[int, torch.Tensor] = {}
        state = {}
        for name, tensor in self.model.state_dict().items():
            if id(tensor) not in gathered:
                whole = full_tensor(tensor).detach()
                dtype = torch.bfloat16 if whole.is_floating_point() else whole.dtype
                gathered[id(tensor)] = whole.to(device="cpu", dtype=dtype)
            state[name] = gathered[id(tensor)]
        return state

    def ping(self) -> None:
        """Nothing: keeps the followers' wait for a command under the collective timeout."""

    def stop(self) -> None:
        return None


def _command_group(device_type: str) -> dist.ProcessGroup | None:
    # Commands are Python objects: a gloo group, whatever carries the tensors.
    return dist.new_group(backend="gloo") if device_type == "cuda" else None


def local_device(device: str, local_rank: int) -> str:
    return f"cuda:{local_rank}" if torch.device(device).type == "cuda" else "cpu"


class RankGroup:
    """The leader's side: start the local followers, join the group, broadcast commands."""

    def __init__(self, setup: RankSetup, device: str) -> None:
        self.setup = setup
        port = setup.main_port or _free_port()
        device_type = torch.device(device).type
        # The followers use as many CPU threads as this process was given (--torch-threads).
        threads_env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
        self.followers = [
            subprocess.Popen([sys.executable, "-m", "client_image.training.rank_group",
                              "--rank", str(rank), "--world-size", str(setup.dims.world_size),
                              "--main-host", setup.main_host, "--main-port", str(port),
                              "--local-rank", str(rank), "--device", device_type],
                             env=threads_env)
            for rank in range(1, setup.here)]
        init_process_group(0, setup.dims.world_size, setup.main_host, port, device_type)
        self._group = _command_group(device_type)
        self._lock = threading.Lock()
        self.executor = RankExecutor(local_device(device, 0))
        self._last_command = time.monotonic()
        self._closed = threading.Event()
        threading.Thread(target=self._keep_alive, name="rank-ping", daemon=True).start()

    def run(self, name: str, *args: Any) -> Any:
        """Broadcast the command, then run it here: every rank runs commands in one order."""
        with self._lock:
            dead = [(f.args, f.returncode) for f in self.followers if f.poll() is not None]
            if dead and name != "stop":
                raise RankFailed(f"a rank process of this client exited (code {dead[0][1]}): "
                                 "its part of the model is lost")
            self._last_command = time.monotonic()
            dist.broadcast_object_list([(name, args)], src=0, group=self._group)
            return getattr(self.executor, name)(*args)

    def _keep_alive(self) -> None:
        while not self._closed.wait(PING_INTERVAL_S / 4):
            if time.monotonic() - self._last_command > PING_INTERVAL_S:
                try:
                    self.run("ping")
                except (RankFailed, RuntimeError) as exc:  # the next real command says it too
                    log.warning("ranks: %s", exc)
                    return

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the followers: the `stop` command once the command running now (a training
        step) has ended, then wait for them to exit; whatever is not done within
        `timeout_s` (a command that does not end, a follower that does not exit) is killed."""
        self._closed.set()
        if not dist.is_initialized():
            return
        deadline = time.monotonic() + timeout_s
        broken = any(f.poll() is not None for f in self.followers)  # cannot stop a broken group
        if broken or not self._lock.acquire(timeout=timeout_s):
            self.kill()
            return
        try:
            dist.broadcast_object_list([("stop", ())], src=0, group=self._group)
        except (RuntimeError, ConnectionError):
            self.kill()
            return
        finally:
            self._lock.release()
        for follower in self.followers:
            try:
                follower.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                follower.kill()
        dist.destroy_process_group()

    def kill(self) -> None:
        """Kill every local follower at once (from any thread): a stop out of time."""
        self._closed.set()
        for follower in self.followers:
            if follower.poll() is None:
                follower.kill()
        for follower in self.followers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                follower.wait(timeout=5)


def follow(rank: int, world_size: int, main_host: str, main_port: int, local_rank: int,
           device_type: str) -> None:
    """A follower's life: join, then run the leader's commands until `stop`."""
    init_process_group(rank, world_size, main_host, main_port, device_type, local_rank)
    group = _command_group(device_type)
    executor = RankExecutor(local_device(device_type, local_rank))
    while True:
        command: list[Any] = [None]
        dist.broadcast_object_list(command, src=0, group=group)
        name, args = command[0]
        getattr(executor, name)(*args)
        if name == "stop":
            break
    dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _leave_with_the_leader() -> Callable[[], None]:
    """A local follower belongs to its leader (the client process that started it): the
    leader stops it (`stop`), so a ctrl+c or a closed terminal, which reach the whole
    process group, are the leader's to handle; and once the leader is gone, however it
    went (killed, or out of time while stopping), the follower exits too instead of
    waiting in a collective for a peer that will never come. Returns what ends the watch
    (before the interpreter exits: a daemon thread still running then can abort it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    leader = os.getppid()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if os.getppid() != leader:
                os._exit(0)

    watcher = threading.Thread(target=watch, name="leader-watch", daemon=True)
    watcher.start()

    def stop() -> None:
        done.set()
        watcher.join()

    return stop


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="one follower rank of a psyche client")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--main-host", required=True)
    parser.add_argument("--main-port", type=int, required=True)
    parser.add_argument("--local-rank", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    stop_watching = _leave_with_the_leader()
    try:
        follow(args.rank, args.world_size, args.main_host, args.main_port, args.local_rank,
               args.device)
    except (RuntimeError, ConnectionError) as exc:  # the leader went away: nothing to keep
        print(f"psyche rank {args.rank}: the client's process group ended: {exc}",
              file=sys.stderr)
        sys.exit(1)
    finally:
        stop_watching()
    # Stopped cleanly: leave without the interpreter's teardown, where the process
    # group's threads still running can abort the process (exit -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
