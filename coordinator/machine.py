"""The coordinator state machine: `tick` and the client events (docs/coordinator.md, "Tick"
and "Events").

Every public method returns a value: `TickResult` or `None` on success, `Rejected` when
the call is refused; a refused call leaves the state exactly as it was (all checks run
before the first mutation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.checkpoint_reports import after_report, report_problem
from coordinator.commitment import participant_item
from coordinator.committee import Committee, CommitteeProof, SelectionError, witness_quorum
from coordinator.config import Checkpoint, GcsCheckpoint, HubCheckpoint, StateFile
from coordinator.core import CoordinatorCore, with_checkpoint
from coordinator.data_assignment import selection_for_round
from coordinator.limits import MAX_CLIENTS, MAX_WITNESSES, ClientState, RunState
from coordinator.outcomes import CoordinatorError, Rejected, TickResult
from coordinator.state import CoordinatorState, NodeIdentity, Round, VerificationReport, Witness
from coordinator.verification import (
    REPORT_QUORUM,
    eligible_joiners,
    plan_for_epoch,
    reporters_of,
)
from coordinator.verification import report_problem as verification_report_problem

U64_MAX = 2**64 - 1
U16_MAX = 2**16 - 1


def _dedupe(pending: Sequence[NodeIdentity]) -> list[NodeIdentity]:
    seen: set[NodeIdentity] = set()
    unique = []
    for node in pending:
        if node not in seen:
            seen.add(node)
            unique.append(node)
    return unique


class Coordinator(CoordinatorCore):
    """Owns one `CoordinatorState`; see the package docstring for how a backend drives it."""

    @classmethod
    def from_state_file(cls, state_file: StateFile) -> Coordinator:
        core = CoordinatorCore.from_state_file(state_file)
        return cls(core.state)

    # ------------------------------------------------------------------ tick
    def tick(self, pending: Sequence[NodeIdentity], now: int, seed: int,
             replay_classes: Mapping[NodeIdentity, int] | None = None) -> TickResult | Rejected:
        """Advance by time. `pending`: clients asking to join (used in WaitingForMembers);
        `replay_classes`: their replay classes, u16 (absent: 0), kept by a warm-up."""
        if not (0 <= now <= U64_MAX and 0 <= seed <= U64_MAX):
            return Rejected(CoordinatorError.WrongRunState, "now and seed must be u64")
        for node, replay_class in (replay_classes or {}).items():
            if not 0 <= replay_class <= U16_MAX:
                return Rejected(CoordinatorError.WrongRunState,
                                f"replay class {replay_class} of {node!r} is not a u16")
        run_state = self.state.run_state
        if run_state.halted:
            return Rejected(CoordinatorError.Halted)
        if run_state is RunState.WaitingForMembers:
            return self._tick_waiting_for_members(_dedupe(pending), now, replay_classes)
        if run_state is RunState.Warmup:
            return self._tick_warmup(now, seed)
        if run_state is RunState.RoundTrain:
            if self.timed_out(now, self.state.config.max_round_train_time):
                self.change_state(now, RunState.RoundWitness)
            return TickResult.Ticked
        if run_state is RunState.RoundWitness:
            return self._tick_round_witness(now, seed)
        return self._tick_cooldown(now)

    def _tick_waiting_for_members(self, pending: list[NodeIdentity], now: int,
                                  replay_classes: Mapping[NodeIdentity, int] | None
                                  ) -> TickResult:
        config = self.state.config
        # With verification on, only joiners whose class enough others share count, are
        # listed and can be the holder waited for; the others stay pending (issue 36).
        eligible = eligible_joiners(pending, replay_classes or {}, config.verification_percent)
        if len(eligible) >= config.init_min_clients and self.timed_out(
                now, config.waiting_for_members_extra_time):
            if self.waits_for_holder(eligible):
                # The model is gone: wait for a holder, a report or the authority.
                self.state.model_lost = True
            else:
                self.start_warmup(now, eligible, replay_classes)
        return TickResult.Ticked

    def _tick_warmup(self, now: int, seed: int) -> TickResult:
        if self.timed_out(now, self.state.config.warmup_time):
            self.start_round_train(now, seed)
            return TickResult.Ticked
        self.move_clients_to_exited(0)
        if len(self.state.epoch_state.clients) < self.state.config.min_clients:
            self.start_waiting_for_members(now)
            self.credit_epoch()
            return TickResult.EpochEndFailure
        return TickResult.Ticked

    def _tick_round_witness(self, now: int, seed: int) -> TickResult:
        state, config, epoch = self.state, self.state.config, self.state.epoch_state
        if not self.timed_out(now, config.round_witness_time):
            return TickResult.Ticked
        epoch.first_round = False
        state.progress.step = min(state.progress.step + 1, 2**32 - 1)
        round_ = state.current_round
        witnesses = len(round_.witnesses)
        self.move_clients_to_exited(round_.height)
        if witnesses == 0:
            # No witness: we cannot tell who is still there; end the epoch. Psyche also
            # withdraws everyone, so the next epoch restarts from the stored checkpoint
            # (the initial model when nobody uploads one). Past the first round, though,
            # every earlier round was witnessed by a quorum: the clients hold the model
            # (often only the one witness died), so they stay and the next epoch fetches it
            # from whichever of them are still there. In the first round nothing was
            # proven of the newcomers, but the last epoch's clients held the model before
            # it began: they stay, or the run would restart from the stored model with
            # its holders alive (a chaos run lost 109 steps so: a restarted holder still
            # loading, its epoch's only witness gave up waiting for it).
            if round_.height == 0:
                self.withdraw_all_but_holders()
            self.start_cooldown(now)
            return TickResult.Ticked
        # Two more rounds apply the last trained steps; the pipeline needs 4 rounds.
        if (now >= epoch.start_timestamp + config.epoch_time and epoch.last_step == 0
                and state.progress.step + 2 >= 4):
            epoch.last_step = state.progress.step + 2
        if epoch.last_step != 0 and state.progress.step == epoch.last_step:
            self.start_cooldown(now)
            return TickResult.Ticked
        if (len(epoch.clients) < config.min_clients
                or witnesses < witness_quorum(self.witness_target())
                or state.progress.step >= config.total_steps
                or state.pending_pause):
            self.start_cooldown(now)
            return TickResult.Ticked
        self.start_round_train(now, seed)
        return TickResult.Ticked

    def _tick_cooldown(self, now: int) -> TickResult:
        if not self.timed_out(now, self.state.config.cooldown_time):
            return TickResult.Ticked
        self.end_cooldown(now)
        self.credit_epoch()
        return TickResult.EpochEndSuccess

    # ---------------------------------------------------------------- events
    def _witness_problem(self, sender: NodeIdentity, witness: Witness,
                         round_: Round) -> Rejected | None:
        clients = self.state.epoch_state.clients
        index = witness.proof.index
        if not 0 <= index < len(clients):
            return Rejected(CoordinatorError.InvalidClientIndex, f"index {index}")
        if clients[index].id != sender:
            return Rejected(CoordinatorError.NotYourIndex, f"index {index}")
        for stored in round_.witnesses:
            stored_index = stored.proof.index
            if stored_index < len(clients) and clients[stored_index].id == sender:
                return Rejected(CoordinatorError.DuplicateWitness)
        if len(round_.witnesses) >= min(self.witness_target(), MAX_WITNESSES):
            return Rejected(CoordinatorError.WitnessesFull)
        return None

    def warmup_witness(self, sender: NodeIdentity, witness: Witness, now: int,
                       seed: int) -> Rejected | None:
        """A client has loaded the model; W of them start the first round early."""
        if self.state.run_state is RunState.RoundTrain:
            return None  # late warm-up witness: harmless
        if self.state.run_state is not RunState.Warmup:
            return Rejected(CoordinatorError.WrongRunState, self.state.run_state.name)
        round_ = self.state.current_round
        problem = self._witness_problem(sender, witness, round_)
        if problem is not None:
            return problem
        round_.witnesses.append(witness)
        if len(round_.witnesses) == self.witness_target():
            self.start_round_train(now, seed)
        return None

    def witness(self, sender: NodeIdentity, witness: Witness, now: int) -> Rejected | None:
        """An elected witness reports the round; all W of them end RoundTrain early."""
        state = self.state
        if state.run_state not in (RunState.RoundTrain, RunState.RoundWitness):
            return Rejected(CoordinatorError.WrongRunState, state.run_state.name)
        round_ = state.current_round
        try:
            selection = selection_for_round(state)
        except SelectionError as exc:
            return Rejected(CoordinatorError.InvalidWitnessProof, str(exc))
        proof = witness.proof
        if not proof.witness or not selection.verify_witness(proof):
            return Rejected(CoordinatorError.InvalidWitnessProof,
                            f"position {proof.position} index {proof.index}")
        problem = self._witness_problem(sender, witness, round_)
        if problem is not None:
            return problem
        round_.witnesses.append(witness)
        if len(round_.witnesses) == self.witness_target() and state.run_state is RunState.RoundTrain:
            self.change_state(now, RunState.RoundWitness)
        return None

    def is_healthy(self, node: NodeIdentity, proof: CommitteeProof) -> bool:
        """A Trainer of the previous round is healthy iff at least quorum of that
        round's witnesses have its SHA-256(signer) in their participant bloom."""
        previous = self.state.previous_round
        if previous is None:
            return True
        item = participant_item(node.key)
        confirmations = sum(1 for w in previous.witnesses if w.participant_bloom.contains(item))
        return confirmations >= witness_quorum(len(previous.witnesses))

    def health_check(self, sender: NodeIdentity,
                     checks: Sequence[tuple[NodeIdentity, CommitteeProof]]) -> Rejected | None:
        """Drop the listed clients; refused as a whole unless every one is unhealthy."""
        state = self.state
        if not state.run_state.active or state.run_state is RunState.Cooldown:
            return Rejected(CoordinatorError.WrongRunState, state.run_state.name)
        if state.index_of(sender) is None:
            return Rejected(CoordinatorError.NotAClient)
        previous = state.previous_round
        if state.current_round.height < 2 or previous is None:
            return Rejected(CoordinatorError.HealthCheckTooEarly)
        try:
            selection = selection_for_round(state, previous)
        except SelectionError as exc:
            return Rejected(CoordinatorError.InvalidHealthCheck, str(exc))
        if not checks:
            return Rejected(CoordinatorError.InvalidHealthCheck, "empty list")
        for node, proof in checks:
            listed = state.client_at(proof.index, previous.clients_len)
            if (proof.committee is not Committee.Trainer or not selection.verify_committee(proof)
                    or listed is None or listed.id != node):
                return Rejected(CoordinatorError.InvalidHealthCheck, f"bad proof for {node!r}")
            if self.is_healthy(node, proof):
                return Rejected(CoordinatorError.InvalidHealthCheck, f"{node!r} is healthy")
        for node, _ in checks:
            index = state.index_of(node)
            if index is not None and state.epoch_state.clients[index].state is ClientState.Healthy:
                state.epoch_state.clients[index].state = ClientState.Dropped
        return None

    def verification_report(self, sender: NodeIdentity,
                            report: VerificationReport) -> Rejected | None:
        """A follower's replay does not reproduce a trainer's result: record the evidence;
        REPORT_QUORUM distinct followers eject the trainer (no points this epoch, slashed
        at the epoch's end where the run sets a rate). coordinator/verification.py."""
        state = self.state
        if not state.run_state.active:
            return Rejected(CoordinatorError.WrongRunState, state.run_state.name)
        index = state.index_of(sender)
        if index is None or state.epoch_state.clients[index].state is not ClientState.Healthy:
            return Rejected(CoordinatorError.NotAClient)
        if report.reporter != sender:
            return Rejected(CoordinatorError.InvalidVerificationReport,
                            "the reporter must be the sender")
        epoch = state.epoch_state
        plan = plan_for_epoch(epoch, state.config.verification_percent)
        problem = verification_report_problem(epoch, plan, report, state.progress.step)
        if problem is not None:
            return Rejected(CoordinatorError.InvalidVerificationReport, problem)
        epoch.reports.append(report)
        accused = state.index_of(report.accused)
        if (accused is not None and len(reporters_of(epoch, report.accused)) >= REPORT_QUORUM
                and epoch.clients[accused].state is ClientState.Healthy):
            epoch.clients[accused].state = ClientState.Ejected
        return None

    def checkpoint(self, sender: NodeIdentity, index: int, repo: Checkpoint) -> Rejected | None:
        """A client uploaded the epoch's model: record its revision. Unlike Psyche (any
        repository, last writer wins), the report must name the run's own repository, the
        one its authority configured (coordinator/checkpoint_reports.py)."""
        state = self.state
        if state.run_state.halted:
            return Rejected(CoordinatorError.Halted)
        clients = state.epoch_state.clients
        if not 0 <= index < len(clients):
            return Rejected(CoordinatorError.InvalidClientIndex, f"index {index}")
        if clients[index].id != sender:
            return Rejected(CoordinatorError.NotYourIndex, f"index {index}")
        if not isinstance(repo, HubCheckpoint | GcsCheckpoint):
            return Rejected(CoordinatorError.InvalidCheckpoint, type(repo).__name__)
        problem = report_problem(state.model.checkpoint, repo)
        if problem is not None:
            return Rejected(CoordinatorError.CheckpointNotRunRepository, problem)
        state.model = with_checkpoint(state.model, after_report(state.model.checkpoint, repo))
        # The upload holds the model of the epoch's last step (reported in its cooldown, or
        # later while no round past the next epoch's first applied anything since): the
        # stored checkpoint is as new as the clients' model again.
        if not (state.run_state in (RunState.RoundTrain, RunState.RoundWitness)
                and state.current_round.height > 0):
            state.model_ahead = False
            state.model_lost = False
        return None

    def withdraw(self, index: int) -> Rejected | None:
        """The backend saw client `index` leave (e.g. its connection closed)."""
        clients = self.state.epoch_state.clients
        if self.state.run_state.halted:
            return Rejected(CoordinatorError.Halted)
        if not 0 <= index < len(clients):
            return Rejected(CoordinatorError.InvalidClientIndex, f"index {index}")
        if clients[index].state is not ClientState.Healthy:
            return Rejected(CoordinatorError.InvalidWithdraw, clients[index].state.name)
        clients[index].state = ClientState.Withdrawn
        return None

    def pause(self, now: int) -> Rejected | None:
        """Active: pause after this epoch's Cooldown. Otherwise pause now (withdraw all)."""
        if self.state.run_state.halted:
            return Rejected(CoordinatorError.Halted)
        if self.state.run_state.active:
            self.state.pending_pause = True
        else:
            self.enter_paused(now)
        return None

    def accept_model_loss(self) -> Rejected | None:
        """The run's authority accepts that the clients' newer model is lost: the run goes
        on from the stored checkpoint (counted in `model_resets`). Allowed while the run is
        between epochs (WaitingForMembers or Paused) and a fall back would lose training."""
        state = self.state
        if state.run_state not in (RunState.WaitingForMembers, RunState.Paused):
            return Rejected(CoordinatorError.WrongRunState,
                            f"{state.run_state.name}: only a run waiting for members or "
                            "paused can accept the loss of its model")
        if not self.falling_back_loses_training():
            return Rejected(CoordinatorError.WrongRunState,
                            "the stored checkpoint is as new as the clients' model: nothing "
                            "to lose")
        self.fall_back_to_stored_checkpoint()
        return None

    def resume(self, now: int) -> Rejected | None:
        if self.state.run_state not in (RunState.Paused, RunState.Uninitialized):
            return Rejected(CoordinatorError.CannotResume, self.state.run_state.name)
        self.start_waiting_for_members(now)
        return None


def coordinator_from_state(state: CoordinatorState) -> Coordinator:
    return Coordinator(state)


__all__ = ["MAX_CLIENTS", "Coordinator", "coordinator_from_state"]
