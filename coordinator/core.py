"""State transitions shared by tick and the events (docs/coordinator.md, "Tick")."""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.config import (
    Checkpoint,
    DummyCheckpoint,
    GcsCheckpoint,
    HubCheckpoint,
    LLMConfig,
    P2PCheckpoint,
    P2PGcsCheckpoint,
    StateFile,
)
from coordinator.data_assignment import round_batch_size
from coordinator.limits import MAX_CLIENTS, NUM_STORED_ROUNDS, ClientState, RunState
from coordinator.rewards import credit_epoch, start_epoch_rates
from coordinator.state import Client, CoordinatorState, EpochState, NodeIdentity, Progress


def with_checkpoint(model: LLMConfig, checkpoint: Checkpoint) -> LLMConfig:
    return model.model_copy(update={"checkpoint": checkpoint})


class CoordinatorCore:
    def __init__(self, state: CoordinatorState):
        self.state = state

    @classmethod
    def from_state_file(cls, state_file: StateFile) -> CoordinatorCore:
        progress = state_file.progress
        return cls(CoordinatorState(
            run_id=state_file.run_id,
            run_state=state_file.initial_run_state,
            model=state_file.model,
            config=state_file.config,
            progress=Progress(progress.epoch, progress.step, progress.epoch_start_data_index)
            if progress else Progress(),
            client_version=state_file.client_version,
        ))

    # -- helpers: timeouts, state changes, exits (docs/coordinator.md, "Tick")
    def timed_out(self, now: int, duration: int) -> bool:
        start = self.state.run_state_start_unix_timestamp
        return now != start and now >= start + duration

    def change_state(self, now: int, new_state: RunState) -> None:
        self.state.run_state_start_unix_timestamp = now
        self.state.run_state = new_state

    def move_clients_to_exited(self, height: int) -> None:
        epoch = self.state.epoch_state
        staying = []
        for client in epoch.clients:
            if client.state is ClientState.Healthy:
                staying.append(client)
            elif len(epoch.exited_clients) < MAX_CLIENTS:
                client.exited_height = height
                epoch.exited_clients.append(client)
        epoch.clients = staying

    def withdraw_all(self) -> None:
        for client in self.state.epoch_state.clients:
            if client.state is ClientState.Healthy:
                client.state = ClientState.Withdrawn

    def withdraw_all_but_holders(self) -> None:
        """Withdraw every Healthy client that does not hold the model of the epoch's start
        step (`Client.holds_model`): an unwitnessed first round proves nothing of the
        others, but the holders had the model before it began."""
        for client in self.state.epoch_state.clients:
            if client.state is ClientState.Healthy and not client.holds_model:
                client.state = ClientState.Withdrawn

    def witness_target(self) -> int:
        """W: witnesses that end a phase early (witness_nodes, or min(clients, 32) if 0)."""
        return self.state.config.witness_count(len(self.state.epoch_state.clients))

    # -- transitions
    def start_waiting_for_members(self, now: int) -> None:
        done = self.state.progress.step >= self.state.config.total_steps
        self.change_state(now, RunState.Finished if done else RunState.WaitingForMembers)

    def holders_listed(self) -> set[NodeIdentity]:
        """Who holds the last epoch's model, between epochs: its clients still listed,
        Healthy or Withdrawn since (a pause withdraws everyone, a client may leave and
        come back with its checkpoint); never a Dropped or Ejected one."""
        return {client.id for client in self.state.epoch_state.clients
                if client.state in (ClientState.Healthy, ClientState.Withdrawn)}

    def falling_back_loses_training(self) -> bool:
        """Whether the stored checkpoint is older than the clients' model: the run
        continues from its clients (P2P/P2PGcs) and they applied training since the stored
        checkpoint was loaded or last reported (`model_ahead`)."""
        state = self.state
        return (isinstance(state.model.checkpoint, P2PCheckpoint | P2PGcsCheckpoint)
                and state.model_ahead)

    def waits_for_holder(self, pending: list[NodeIdentity]) -> bool:
        """A warm-up is due: must it wait for a holder of the model instead? Yes when no
        holder is pending and falling back would lose applied training (the model is
        never silently replaced by an older one)."""
        return (not self.holders_listed().intersection(pending)
                and self.falling_back_loses_training())

    def fall_back_to_stored_checkpoint(self) -> None:
        """Nobody holds the last epoch's model: the run's checkpoint goes from P2P back to
        Hub (Dummy for the built-in model) and from P2PGcs to Gcs, counting a model reset
        when the clients' model was ahead of it."""
        state = self.state
        checkpoint = state.model.checkpoint
        if self.falling_back_loses_training():
            state.model_resets = min(state.model_resets + 1, 2**16 - 1)
        if isinstance(checkpoint, P2PCheckpoint) and not checkpoint.repo_id:
            # A Dummy run of the built-in model has no repository: rebuild it.
            state.model = with_checkpoint(state.model, DummyCheckpoint(repo_id=""))
        elif isinstance(checkpoint, P2PCheckpoint):
            state.model = with_checkpoint(state.model, HubCheckpoint(
                repo_id=checkpoint.repo_id, revision=checkpoint.revision))
        elif isinstance(checkpoint, P2PGcsCheckpoint):
            state.model = with_checkpoint(state.model, GcsCheckpoint(
                bucket=checkpoint.bucket, prefix=checkpoint.prefix))
        state.model_ahead = False  # everyone loads the stored checkpoint
        state.model_lost = False

    def start_warmup(self, now: int, pending: list[NodeIdentity],
                     replay_classes: Mapping[NodeIdentity, int] | None = None) -> None:
        """`replay_classes`: the joiners' replay classes (absent: 0), kept in their Client."""
        state = self.state
        classes = replay_classes or {}
        previous = self.holders_listed()
        self.move_clients_to_exited(state.current_round.height)
        if not previous.intersection(pending):
            self.fall_back_to_stored_checkpoint()
        state.model_lost = False
        # Who holds the model of this epoch's start step: the last epoch's clients, when
        # the epoch continues from them (not from a stored checkpoint everyone loads).
        continuing = isinstance(state.model.checkpoint, P2PCheckpoint | P2PGcsCheckpoint)
        if not continuing:
            state.model_ahead = False  # everyone loads the stored checkpoint
        state.epoch_state = EpochState(
            clients=[Client(node, holds_model=continuing and node in previous,
                            replay_class=classes.get(node, 0))
                     for node in pending[:MAX_CLIENTS]],
            start_step=state.progress.step, start_timestamp=now, first_round=True,
            cold_start_epoch=state.epoch_state.cold_start_epoch)
        start_epoch_rates(state.rewards)
        self.change_state(now, RunState.Warmup)

    def start_round_train(self, now: int, seed: int) -> None:
        state, epoch = self.state, self.state.epoch_state
        if epoch.first_round:
            head, height, data_index = 0, 0, state.progress.epoch_start_data_index
        else:
            previous = epoch.rounds[epoch.rounds_head]
            head = (epoch.rounds_head + 1) % NUM_STORED_ROUNDS
            height = previous.height + 1
            data_index = previous.data_index + round_batch_size(
                state.config, state.model.max_seq_len, previous)
        round_ = epoch.rounds[head]
        epoch.rounds_head = head
        if height > 0:
            state.model_ahead = True  # this round applies the witnessed one before it
        round_.clients_len = len(epoch.clients)
        round_.height = height
        round_.data_index = data_index
        round_.tie_breaker_tasks = 0
        round_.random_seed = seed
        round_.witnesses = []
        if height == 0:
            epoch.verification_seed = seed
        self.change_state(now, RunState.RoundTrain)

    def start_cooldown(self, now: int) -> None:
        self.state.current_round.witnesses = []  # reused by the next warm-up
        self.change_state(now, RunState.Cooldown)

    def end_cooldown(self, now: int) -> None:
        state = self.state
        round_ = state.current_round
        state.progress.epoch_start_data_index = round_.data_index + round_batch_size(
            state.config, state.model.max_seq_len, round_)
        state.progress.epoch = min(state.progress.epoch + 1, 2**16 - 1)
        self.move_clients_to_exited(round_.height)
        # The epoch's clients now hold the model: the next epoch fetches it from them.
        checkpoint = state.model.checkpoint
        if isinstance(checkpoint, HubCheckpoint | DummyCheckpoint):
            state.model = with_checkpoint(state.model, P2PCheckpoint(
                repo_id=checkpoint.repo_id, revision=checkpoint.revision))
        elif isinstance(checkpoint, GcsCheckpoint):
            state.model = with_checkpoint(state.model, P2PGcsCheckpoint(
                bucket=checkpoint.bucket, prefix=checkpoint.prefix))
        if state.pending_pause:
            self.enter_paused(now)
        else:
            self.start_waiting_for_members(now)
            state.epoch_state.cold_start_epoch = False

    def enter_paused(self, now: int) -> None:
        self.withdraw_all()
        self.change_state(now, RunState.Paused)
        self.state.pending_pause = False
        self.state.epoch_state.cold_start_epoch = True

    def credit_epoch(self) -> None:
        credit_epoch(self.state.rewards, self.state.epoch_state)
