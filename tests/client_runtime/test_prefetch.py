"""The round's batch fetched as the round's state arrives (client_image/runtime/prefetch.py):
the same bytes as an inline fetch, the wait recorded, nothing left behind by a round that
ended before its fetch did."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from runner_swarm import FakeSwarm, FakeWorker

from client_image.runtime.events import Trained
from client_image.runtime.prefetch import BatchPrefetch, batch_fetch
from coordinator.config import SeededShuffle
from psyche_common.token_files import LocalDataProvider

SEQ = 16


@pytest.fixture
def provider(tmp_path: Path) -> LocalDataProvider:
    rng = np.random.default_rng(3)
    for name in ("a.ds", "b.ds"):
        (tmp_path / name).write_bytes(rng.integers(0, 50_000, 40 * SEQ + 1).astype("<u2").tobytes())
    return LocalDataProvider(tmp_path, SEQ, shuffle=SeededShuffle(seed=bytes([5] * 32)))


class DelayedData:
    """A real provider behind a fixed delay: a data host further away than a local disk."""

    def __init__(self, inner: LocalDataProvider | None, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.started = 0
        self.gate: asyncio.Event | None = None  # when set, fetches wait for it too

    async def fetch(self, start: int, end: int) -> torch.Tensor:
        self.started += 1
        await asyncio.sleep(self.delay_s)
        if self.gate is not None:
            await self.gate.wait()
        if self.inner is None:
            return torch.zeros((end - start + 1, 8), dtype=torch.int64)
        return await self.inner.fetch(start, end)


def _other_tasks() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_a_prefetched_batch_is_the_inline_batch_and_costs_no_wait(provider):
    prefetch = BatchPrefetch()
    prefetch.start(4, (10, 25), batch_fetch(provider, (10, 25), "Pretraining"))
    await asyncio.sleep(0.2)  # the round's start work
    tokens, waited = await prefetch.take(4, (10, 25), batch_fetch(provider, (10, 25), "Pretraining"))
    assert torch.equal(tokens, provider.get_samples(10, 25))
    assert waited < 0.05 and prefetch.pending_steps() == []


async def test_the_wait_is_what_the_fetch_had_left_when_training_began(provider):
    slow = DelayedData(provider, 0.3)
    prefetch = BatchPrefetch()
    prefetch.start(1, (0, 3), batch_fetch(slow, (0, 3), "Pretraining"))
    await asyncio.sleep(0.1)
    tokens, waited = await prefetch.take(1, (0, 3), batch_fetch(slow, (0, 3), "Pretraining"))
    assert 0.1 <= waited <= 0.3 and slow.started == 1
    # Nothing prefetched: the whole fetch is waited for.
    _, waited = await prefetch.take(2, (4, 7), batch_fetch(slow, (4, 7), "Pretraining"))
    assert waited >= 0.3 and slow.started == 2
    assert torch.equal(tokens, provider.get_samples(0, 3))


async def test_a_finetuning_prefetch_carries_the_labels(provider):
    prefetch = BatchPrefetch()
    prefetch.start(1, (2, 5), batch_fetch(provider, (2, 5), "Finetuning"))
    tokens, _ = await prefetch.take(1, (2, 5), batch_fetch(provider, (2, 5), "Finetuning"))
    inputs = provider.get_samples(2, 5)
    assert tokens.shape == (4, 2, SEQ) and torch.equal(tokens[:, 0], inputs)
    assert torch.equal(tokens[:, 1], inputs)  # token files have no labels: the inputs


async def test_a_prefetch_of_another_batch_is_dropped_for_the_right_one(provider):
    blocked = DelayedData(provider, 0)
    blocked.gate = asyncio.Event()
    prefetch = BatchPrefetch()
    prefetch.start(3, (0, 1), batch_fetch(blocked, (0, 1), "Pretraining"))
    await asyncio.sleep(0)
    tokens, _ = await prefetch.take(3, (8, 9), batch_fetch(provider, (8, 9), "Pretraining"))
    assert torch.equal(tokens, provider.get_samples(8, 9))
    assert _other_tasks() == set()


async def test_cancelled_prefetches_leave_no_task_behind(provider):
    blocked = DelayedData(provider, 0)
    blocked.gate = asyncio.Event()
    prefetch = BatchPrefetch()
    for step in (1, 2, 3):
        prefetch.start(step, (step, step), batch_fetch(blocked, (step, step), "Pretraining"))
    await asyncio.sleep(0)
    assert blocked.started == 3 and len(_other_tasks()) == 3
    prefetch.cancel_before(3)  # rounds 1 and 2 are over
    await asyncio.sleep(0)
    assert prefetch.pending_steps() == [3] and len(_other_tasks()) == 1
    prefetch.cancel_all()  # a desync
    await asyncio.sleep(0)
    assert prefetch.pending_steps() == [] and _other_tasks() == set()
    prefetch.start(4, (4, 4), batch_fetch(blocked, (4, 4), "Pretraining"))
    await prefetch.close()
    assert _other_tasks() == set()


async def test_a_failed_prefetch_fails_the_take_and_an_untaken_one_logs_nothing(provider):
    complaints: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: complaints.append(context))
    prefetch = BatchPrefetch()
    bad = batch_fetch(provider, (0, 10_000), "Pretraining")
    prefetch.start(1, (0, 10_000), bad)
    with pytest.raises(Exception, match="out of range"):
        await prefetch.take(1, (0, 10_000), bad)
    prefetch.start(2, (0, 10_000), bad)
    await asyncio.sleep(0.1)
    prefetch.cancel_all()  # its round ended without taking it
    gc.collect()
    await asyncio.sleep(0)
    assert complaints == []


async def test_the_runner_fetches_while_it_applies_and_records_the_wait():
    swarm = FakeSwarm(2)
    apply_s, fetch_s = 0.5, 0.25
    for runner in swarm.runners:
        worker = runner.worker
        assert isinstance(worker, FakeWorker)
        original_apply = worker.apply

        async def slow_apply(step: int, payloads: Sequence[bytes],
                             original: Callable[..., Awaitable[int]] = original_apply) -> int:
            await asyncio.sleep(apply_s)  # a large model's apply
            return await original(step, payloads)

        worker.apply = slow_apply  # type: ignore[method-assign]  # a slow apply, to measure the overlap

        async def open_delayed(state: object) -> DelayedData:
            return DelayedData(None, fetch_s)

        runner.open_data = open_delayed
    # Real sleeps: let every runner's work end before the coordinator's clock moves on.
    await swarm.tick(0)
    for _ in range(300):
        if swarm.coordinator.state.progress.step >= 6:
            break
        await swarm.drain(timeout_s=10)
        await swarm.turn()
    await swarm.drain(timeout_s=10)
    trained = swarm.events_of(Trained)
    assert {e.step for e in trained} >= {1, 2, 3, 4}
    for event in trained:
        assert event.fields()["data_wait_s"] == event.data_wait_s
        if event.step <= 2:  # heights 0 and 1 apply nothing: the fetch is all the wait
            assert event.data_wait_s >= fetch_s * 0.8, event
        else:  # the fetch ran during the apply of step s-2
            assert event.data_wait_s < fetch_s * 0.5, event
    runner = swarm.runners[0]
    runner.set_desynced("test: a desync cancels the round's fetch")
    assert runner.prefetch.pending_steps() == []
    await runner.close()
