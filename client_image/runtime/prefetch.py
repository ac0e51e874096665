"""The round's batch, fetched from the moment the round's state arrives.

    prefetch = BatchPrefetch()
    prefetch.start(step, batch, fetch)           RoundTrain state arrived: fetch() starts now
    tokens, waited_s = await prefetch.take(step, batch, fetch)
                                                 when training starts: the batch, and how long
                                                 the round waited for it (0 when it was in)
    prefetch.cancel_before(step)                 a later round began: older fetches stop
    prefetch.cancel_all()                        the runner desynced: all of them
    await prefetch.close()                       the runner stops: all, awaited
    batch_fetch(data, batch, data_type) -> Fetch  the fetch of one batch, as the trainer takes it

Why not the next round's batch, during this one: a trainer's batch of round h+1 is a slice
of [data_index(h+1), data_index(h+1) + batch_size) (data_index(h+1) = data_index(h) +
batch_size(h), coordinator core.py `start_round_train`), but which slice is whose follows
from an LCG Fisher-Yates shuffle of the trainers seeded with round h+1's random seed
(coordinator/data_assignment.py), which the coordinator draws only when it starts round
h+1 (in Psyche too: an OS-random u64 per tick centrally, the slot's time on Solana). During
round h a client knows the range of the whole next global batch, not its share of it;
reading the whole range would cost every client T times its own batch (T trainers) in
bandwidth every round, and a TCP data server T times its load. So that is not done.

What is done: the fetch of the round's own batch starts as the state arrives (the
assignment is computed then, rounds.py `StepRecord.for_state`), concurrently with the
work the runner does at round start before it can train (a witness's health check,
applying step s-2's consensus results, which waits for their downloads, and a verifier's
replay), instead of after it. The round waits on data only when the fetch takes longer
than that work; `take` says how long, and the runner records it in the `trained` event's
`data_wait_s`.

A fetch of a round that is over (a later round started, a desync, the runner closing) is
cancelled and awaited, so no task, connection slot or batch tensor outlives its round. A
fetch that fails raises its error from `take`, as an inline fetch did.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import torch

from client_image.data import fetch_training_batch
from client_image.runtime.ports import DataSource
from coordinator.config import DataType

BatchKey = tuple[int, int]
Fetch = Callable[[], Awaitable[torch.Tensor]]


class BatchPrefetch:
    def __init__(self) -> None:
        self._pending: dict[int, tuple[BatchKey, asyncio.Task[torch.Tensor]]] = {}

    def start(self, step: int, batch: BatchKey, fetch: Fetch) -> None:
        """Begin fetching `batch` of `step` (once; a second start for the step is ignored)."""
        if step in self._pending:
            return

        async def run() -> torch.Tensor:
            return await fetch()

        task = asyncio.create_task(run(), name=f"prefetch-{step}")
        # A failure is raised by `take`; a fetch nobody takes (its round ended in an error)
        # must not log "exception was never retrieved".
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._pending[step] = (batch, task)

    async def take(self, step: int, batch: BatchKey, fetch: Fetch) -> tuple[torch.Tensor, float]:
        """The batch (prefetched, or fetched now if it was not) and the seconds waited."""
        started = time.monotonic()
        pending = self._pending.pop(step, None)
        if pending is not None and pending[0] == batch:
            tokens = await pending[1]
        else:
            if pending is not None:
                await _cancelled(pending[1])
            tokens = await fetch()
        return tokens, time.monotonic() - started

    def pending_steps(self) -> list[int]:
        return sorted(self._pending)

    def cancel_before(self, step: int) -> None:
        """Stop the fetches of rounds before `step`: nobody will train them. (A cancelled
        task ends at the loop's next turn; `close` also waits for that.)"""
        for old in [s for s in self._pending if s < step]:
            self._pending.pop(old)[1].cancel()

    def cancel_all(self) -> None:
        for step in list(self._pending):
            self._pending.pop(step)[1].cancel()

    async def close(self) -> None:
        for step in list(self._pending):
            await _cancelled(self._pending.pop(step)[1])


def batch_fetch(data: DataSource, batch: BatchKey, data_type: DataType) -> Fetch:
    """The fetch of `batch` from `data` as the trainer takes it (labels for Finetuning)."""
    return lambda: fetch_training_batch(data, batch[0], batch[1], data_type)


async def _cancelled(task: asyncio.Task[torch.Tensor]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
