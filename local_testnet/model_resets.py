"""Model resets seen live: epochs the coordinator started from the run's stored checkpoint
(Hub, GCS, or a Dummy rebuild) although the last epoch's clients held a newer model (a
P2P checkpoint that had applied training: `CoordinatorState.model_ahead`), and whether a
holder of that model was still alive then.

The testnet's observer feeds it every state; it is told of each SIGKILL. A holder is a
client listed Healthy when the last epoch's cooldown ended; it stays a holder while its
process lives, and after a restart when its own checkpoint of that cooldown is on disk
(it reloads and serves it). A reset with a holder alive is what must never happen; one
with none left is the model really lost.

    resets = ModelResets(checkpoint_of=lambda i, step: path or None)
    resets.observe(state, key_of_client)   # every state, in order
    resets.killed(i)                       # client i was SIGKILLed
    resets.count, resets.with_holder, resets.epochs
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from coordinator import ClientState, CoordinatorState, RunState
from coordinator.config import P2PCheckpoint, P2PGcsCheckpoint


@dataclass(frozen=True)
class ModelReset:
    epoch: int
    step: int  # the epoch's start step: training applied before it was thrown away
    holders_alive: tuple[int, ...]  # clients (1..N) that held the model at that moment


@dataclass
class ModelResets:
    # (client, step) -> whether that client has its checkpoint of `step` on disk
    has_checkpoint: Callable[[int, int], bool]
    resets: list[ModelReset] = field(default_factory=list)
    # the last state's checkpoint was P2P (the clients held the model), ahead of the stored
    _continuing: bool = field(default=False, init=False)
    # the last cooldown's holders: client -> when first seen listed in it
    _holders: dict[int, float] = field(default_factory=dict, init=False)
    _cooldown_epoch: int | None = field(default=None, init=False)
    _killed_at: dict[int, float] = field(default_factory=dict, init=False)  # last SIGKILL
    _warmup_epoch: int | None = field(default=None, init=False)

    @property
    def count(self) -> int:
        return len(self.resets)

    @property
    def with_holder(self) -> int:
        return sum(1 for reset in self.resets if reset.holders_alive)

    @property
    def epochs(self) -> list[int]:
        return [reset.epoch for reset in self.resets]

    def killed(self, client: int) -> None:
        self._killed_at[client] = time.monotonic()

    def observe(self, state: CoordinatorState, clients: Mapping[int, bytes]) -> None:
        """`clients`: client number -> its node key."""
        continuing = (isinstance(state.model.checkpoint, P2PCheckpoint | P2PGcsCheckpoint)
                      and state.model_ahead)
        epoch = state.progress.epoch
        if state.run_state is RunState.Cooldown:
            # The clients listed now are the ones end_cooldown keeps: the model's holders.
            healthy = {c.id.key for c in state.epoch_state.clients
                       if c.state is ClientState.Healthy}
            now = time.monotonic()
            if self._cooldown_epoch != epoch:
                self._cooldown_epoch, self._holders = epoch, {}
            self._holders = {i: self._holders.get(i, now) for i, key in clients.items()
                             if key in healthy}
        elif state.run_state is RunState.Warmup and self._warmup_epoch != epoch:
            self._warmup_epoch = epoch
            if self._continuing and not continuing:
                start = state.epoch_state.start_step
                alive = tuple(sorted(i for i, since in self._holders.items()
                                     if self._killed_at.get(i, -1.0) < since
                                     or self.has_checkpoint(i, start - 1)))
                self.resets.append(ModelReset(epoch, start, alive))
        self._continuing = continuing


def checkpoint_finder(work_dir: Path, run_id: str) -> Callable[[int, int], bool]:
    """Whether client i of a testnet in `work_dir` has a complete checkpoint of `step`."""

    def has_checkpoint(client: int, step: int) -> bool:
        directory = work_dir / f"client-{client}" / "checkpoints" / f"{run_id}-step{step}"
        return (directory / "config.json").is_file()

    return has_checkpoint
