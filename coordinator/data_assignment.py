"""Which client trains which sample indices in a round (docs/coordinator.md,
"Data assignment").

    total = batch_size(round.data_index * max_seq_len)      (global batch, sequences)
    T = number of trainers; base = total // T; the first total % T trainers of the
    LCG-shuffled order (seed = round.random_seed) get one more.
    Shares are contiguous closed ranges [start, end] from round.data_index; empty ones are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.committee import CommitteeSelection
from coordinator.config import CoordinatorConfig
from coordinator.shuffle import lcg_shuffle
from coordinator.state import CoordinatorState, NodeIdentity, Round


@dataclass(frozen=True, order=True, slots=True)
class BatchId:
    """Closed range of sample indices [start, end]."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def round_batch_size(config: CoordinatorConfig, max_seq_len: int, round_: Round) -> int:
    return config.batch_size(round_.data_index * max_seq_len)


def split_batches(data_index: int, total: int, trainers: list[int], seed: int) -> dict[int, BatchId]:
    """trainer index -> its BatchId; trainers are given in index order."""
    if not trainers:
        return {}
    order = lcg_shuffle(trainers, seed)
    base, extra = divmod(total, len(order))
    shares: dict[int, BatchId] = {}
    start = data_index
    for rank, trainer in enumerate(order):
        size = base + (1 if rank < extra else 0)
        if size == 0:
            continue
        shares[trainer] = BatchId(start, start + size - 1)
        start += size
    return shares


def selection_for_round(state: CoordinatorState, round_: Round | None = None) -> CommitteeSelection:
    round_ = round_ if round_ is not None else state.current_round
    return CommitteeSelection(
        n=round_.clients_len, seed=round_.random_seed, witness_nodes=state.config.witness_nodes,
        tie_breakers=round_.tie_breaker_tasks,
        verification_percent=state.config.verification_percent)


def assign_data_for_state(state: CoordinatorState) -> dict[BatchId, NodeIdentity]:
    """The current round's assignment, keyed by batch (the client's view)."""
    round_ = state.current_round
    selection = CommitteeSelection(
        n=len(state.epoch_state.clients), seed=round_.random_seed,
        witness_nodes=min(state.config.witness_nodes, len(state.epoch_state.clients)),
        tie_breakers=round_.tie_breaker_tasks,
        verification_percent=state.config.verification_percent)
    trainers = selection.trainer_indices()
    total = round_batch_size(state.config, state.model.max_seq_len, round_)
    shares = split_batches(round_.data_index, total, trainers, round_.random_seed)
    clients = state.epoch_state.clients
    return {batch: clients[index].id for index, batch in sorted(shares.items(), key=lambda s: s[1])}


def data_index_for_step(config: CoordinatorConfig, max_seq_len: int, step: int) -> int:
    """First sample index of `step`, replaying the batch-size ramp from index 0 at step 1;
    0 for a step outside 1..total_steps, as Psyche's get_data_index_for_step returns."""
    if step <= 1 or step > config.total_steps:
        return 0
    index = 0
    for _ in range(1, step):
        index += config.batch_size(index * max_seq_len)
    return index
