"""The run at one instant, as an operator sees it: the snapshot both TUIs and `--no-tui`
show, and how to build it from a coordinator state.

    snapshot = build_snapshot(ObservedState(state, server_time, received_monotonic, 0))
    snapshot.phase, snapshot.phase_elapsed_s, snapshot.clients, snapshot.witnesses,
    snapshot.verification, snapshot.init_min_clients, snapshot.joined

`phase_elapsed(start, now)` is the one rule for a phase timer: no start (0) or clocks
that cannot be compared give None, never a Unix time shown as seconds.

Every backend (TCP server, Solana account, the client's own view) reduces to a
`RunSnapshot`; the panels never see a `CoordinatorState`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coordinator import (
    ClientState,
    CoordinatorState,
    RunState,
    SelectionError,
    selection_for_round,
    witness_quorum,
)
from coordinator.verification import PPM

RunPhase = Literal[
    "Uninitialized",
    "WaitingForMembers",
    "Warmup",
    "RoundTrain",
    "RoundWitness",
    "Cooldown",
    "Finished",
    "Paused",
]
ClientHealth = Literal["Healthy", "Dropped", "Withdrawn", "Ejected"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunClient(_Frozen):
    """One client of the current epoch, as the coordinator lists it."""

    id: str
    """The client's public key (base58 on Solana, hex on TCP runs)."""
    state: ClientHealth = "Healthy"
    points: int | None = None
    """Reward points earned so far, where the backend keeps them."""


class WitnessProgress(_Frozen):
    """This round's elected witnesses and how far the round is from quorum."""

    elected: list[str] = Field(default_factory=list)
    """Client ids elected as witnesses of this round."""
    received: list[str] = Field(default_factory=list)
    """Elected witnesses whose witness message the coordinator has."""
    quorum: int = Field(default=0, ge=0)
    """Witness messages needed: {1->1, 2->2, 3->2, n>=4 -> floor(2n/3)}."""
    target: int = Field(default=0, ge=0)
    """W, the witnesses per round (config.witness_count): in Warmup, the warm-up witnesses
    (clients with the model loaded, in `received`) that start the first round early."""

    @property
    def fraction(self) -> float:
        return 0.0 if self.quorum == 0 else min(1.0, len(self.received) / self.quorum)


class RunReport(_Frozen):
    """A follower's verification report against a trainer (coordinator.state.VerificationReport),
    distances as fractions (the state carries parts per million)."""

    reporter: str
    accused: str
    step: int = Field(ge=0)
    jaccard: float = Field(ge=0)
    hamming: float = Field(ge=0)
    manhattan: float = Field(ge=0)


class RunVerification(_Frozen):
    """The epoch's verification (docs/verification.md): reports, and who they ejected."""

    percent: int = Field(default=0, ge=0)
    """The run's `verification_percent`: 0 when nobody follows anybody."""
    reports: list[RunReport] = Field(default_factory=list)
    ejected: list[str] = Field(default_factory=list)
    """Client ids ejected in this epoch (listed until the next round, then exited)."""


class RunSnapshot(_Frozen):
    """What the run looks like at one instant."""

    run_id: str
    phase: RunPhase
    phase_elapsed_s: float = Field(default=0.0, ge=0)
    """Seconds since the coordinator entered `phase`."""
    phase_timeout_s: float | None = None
    """Seconds the phase lasts at most (None: no time limit, e.g. WaitingForMembers)."""
    epoch: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)
    clients: list[RunClient] = Field(default_factory=list)
    witnesses: WitnessProgress = Field(default_factory=WitnessProgress)
    client_version: str = ""
    verification: RunVerification = Field(default_factory=RunVerification)
    init_min_clients: int = Field(default=0, ge=0)
    """Clients the run waits for before it starts an epoch (config.init_min_clients)."""
    joined: int | None = Field(default=None, ge=0)
    """Clients asking to take part in the next epoch (connected to the TCP server, or
    joined on Solana); None where the source cannot tell."""
    model_resets: int = Field(default=0, ge=0)
    """Epochs that went back to the run's stored checkpoint, no holder of the newer model
    having come back (CoordinatorState.model_resets)."""
    model_lost: bool = False
    """The run waits for a client holding its newer model, or for its authority to accept
    the loss (CoordinatorState.model_lost)."""


@dataclass(frozen=True)
class ObservedState:
    state: CoordinatorState
    server_time: int
    """The server's unix time (seconds) when it sent the state; 0 when it did not say."""
    received_monotonic: float
    connection: int
    """Which connection delivered it (counts up with every successful handshake)."""
    joined: int | None = None
    """Clients asking to take part, where the source says (RunSnapshot.joined)."""


MAX_PHASE_S = 10 * 365 * 24 * 3600
"""Longer than any phase lasts: an "elapsed" time beyond it is a Unix time (a start of
0, or a start and a clock that are not the same kind of time), not a phase."""


def phase_elapsed(start_unix: float, now_unix: float) -> float | None:
    """Seconds since a phase started at `start_unix` by a clock that says `now_unix`.

    None when the state holds no start (0: a run fresh from its state.toml has no phase
    start yet) or the two times cannot be compared (more than MAX_PHASE_S apart); 0 when
    the clock is behind the start (another machine's clock).
    """
    if start_unix <= 0 or now_unix <= 0:
        return None
    elapsed = now_unix - start_unix
    if elapsed > MAX_PHASE_S:
        return None
    return max(0.0, elapsed)


def phase_timeout_s(state: CoordinatorState) -> float | None:
    """How long the current phase lasts at most; None when it ends on an event only."""
    config = state.config
    timeouts = {
        RunState.WaitingForMembers: config.waiting_for_members_extra_time,
        RunState.Warmup: config.warmup_time,
        RunState.RoundTrain: config.max_round_train_time,
        RunState.RoundWitness: config.round_witness_time,
        RunState.Cooldown: config.cooldown_time,
    }
    timeout = timeouts.get(state.run_state)
    return None if timeout is None else float(timeout)


def witness_progress(state: CoordinatorState) -> WitnessProgress:
    """This round's elected witnesses, those whose witness message arrived, and quorum.

    elected  = selection_for_round(state).witness_indices(), as ids via client_at
    received = the current round's stored witnesses (warm-up witnesses during Warmup)
    quorum   = witness_quorum(W), W = config.witness_count(len(clients))
    """
    clients = state.epoch_state.clients
    target = state.config.witness_count(len(clients))
    round_ = state.current_round
    elected: list[str] = []
    received: list[str] = []
    if state.run_state in (RunState.Warmup, RunState.RoundTrain, RunState.RoundWitness):
        if state.run_state is not RunState.Warmup:
            try:
                indices = selection_for_round(state).witness_indices()
            except SelectionError:
                indices = []  # a round with no clients elects nobody
            for index in indices:
                client = state.client_at(index, round_.clients_len)
                if client is not None:
                    elected.append(client.id.key.hex())
        for witness in round_.witnesses:
            # The coordinator checked proof.index against the epoch's client list.
            index = witness.proof.index
            client = clients[index] if 0 <= index < len(clients) else state.client_at(
                index, round_.clients_len)
            if client is not None:
                received.append(client.id.key.hex())
    return WitnessProgress(elected=elected, received=received, quorum=witness_quorum(target),
                           target=target)


def run_verification(state: CoordinatorState) -> RunVerification:
    epoch = state.epoch_state
    reports = [
        RunReport(reporter=r.reporter.key.hex(), accused=r.accused.key.hex(), step=r.step,
                  jaccard=r.jaccard_ppm / PPM, hamming=r.hamming_ppm / PPM,
                  manhattan=r.manhattan_ppm / PPM)
        for r in epoch.reports
    ]
    ejected = [c.id.key.hex() for c in (*epoch.clients, *epoch.exited_clients)
               if c.state is ClientState.Ejected]
    return RunVerification(percent=state.config.verification_percent, reports=reports,
                           ejected=ejected)


def build_snapshot(observed: ObservedState, now_monotonic: float | None = None) -> RunSnapshot:
    """The RunSnapshot of an observed state; phase time runs on the server's clock."""
    state = observed.state
    now = time.monotonic() if now_monotonic is None else now_monotonic
    # Elapsed = (server time at send - phase start) + time since we received it: no
    # dependence on this machine's wall clock agreeing with the coordinator's.
    server_now = (observed.server_time or time.time()) + max(0.0, now - observed.received_monotonic)
    # A run fresh from its state.toml has no phase start yet (0): no elapsed time to show.
    elapsed = phase_elapsed(state.run_state_start_unix_timestamp, server_now) or 0.0
    points = {entry.id.key: entry.earned for entry in state.rewards.entries}
    clients = [
        RunClient(id=c.id.key.hex(), state=c.state.name, points=points.get(c.id.key))  # type: ignore[arg-type]  # RunState names are the literals
        for c in state.epoch_state.clients
    ]
    return RunSnapshot(
        run_id=state.run_id,
        phase=state.run_state.name,  # type: ignore[arg-type]  # RunState names are the literals
        phase_elapsed_s=elapsed,
        phase_timeout_s=phase_timeout_s(state),
        epoch=state.progress.epoch,
        step=state.progress.step,
        clients=clients,
        witnesses=witness_progress(state),
        client_version=state.client_version,
        verification=run_verification(state),
        init_min_clients=state.config.init_min_clients,
        joined=observed.joined,
        model_resets=state.model_resets,
        model_lost=state.model_lost,
    )
