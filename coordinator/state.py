"""The coordinator's state, field for field in the on-chain repr(C) order
(docs/coordinator.md, "State layout")."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.bloom import Bloom
from coordinator.committee import WitnessProof
from coordinator.config import CoordinatorConfig, LLMConfig
from coordinator.limits import NUM_STORED_ROUNDS, ClientState, RunState


@dataclass(frozen=True, order=True, slots=True)
class NodeIdentity:
    """A client: its 32-byte Ed25519 public key (signer and p2p identity off-chain)."""

    key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.key, bytes) or len(self.key) != 32:
            raise ValueError("a NodeIdentity is a 32-byte Ed25519 public key")

    def __repr__(self) -> str:
        return f"NodeIdentity({self.key.hex()[:12]}…)"


@dataclass(slots=True)
class Client:
    id: NodeIdentity
    state: ClientState = ClientState.Healthy
    exited_height: int = 0
    # Listed in the last epoch's cooldown, in an epoch that continues from its clients'
    # model (P2P): it holds the model of this epoch's start step, witnessed or not.
    holds_model: bool = False
    # What machine it replays on (issue 36): a u16 hash of its declared replay settings'
    # device type, torch build and hardware, 0 = none. Followers of a trainer are chosen
    # among its class first (coordinator/verification.py).
    replay_class: int = 0


@dataclass(slots=True)
class Witness:
    proof: WitnessProof
    participant_bloom: Bloom = field(default_factory=Bloom)
    broadcast_bloom: Bloom = field(default_factory=Bloom)
    broadcast_merkle: bytes = bytes(32)


@dataclass(slots=True)
class Round:
    witnesses: list[Witness] = field(default_factory=list)
    data_index: int = 0
    random_seed: int = 0
    height: int = 0
    clients_len: int = 0
    tie_breaker_tasks: int = 0  # always 0: tie breakers are not implemented


@dataclass(frozen=True, slots=True)
class VerificationReport:
    """A follower's evidence that `accused` published a result its replay does not
    reproduce (coordinator/verification.py): both results' SHA-256 and the distances."""

    reporter: NodeIdentity
    accused: NodeIdentity
    step: int
    published_hash: bytes
    expected_hash: bytes
    jaccard_ppm: int
    hamming_ppm: int
    manhattan_ppm: int


@dataclass(slots=True)
class EpochState:
    rounds: list[Round] = field(default_factory=lambda: [Round() for _ in range(NUM_STORED_ROUNDS)])
    clients: list[Client] = field(default_factory=list)
    exited_clients: list[Client] = field(default_factory=list)
    rounds_head: int = 0
    start_step: int = 0
    last_step: int = 0  # 0 = not set yet
    start_timestamp: int = 0
    first_round: bool = True
    cold_start_epoch: bool = False
    # Verification (coordinator/verification.py): round 0's seed elects the followers.
    verification_seed: int = 0
    reports: list[VerificationReport] = field(default_factory=list)


@dataclass(slots=True)
class Progress:
    epoch: int = 0
    step: int = 1  # steps 1 .. total_steps - 1 are trained
    epoch_start_data_index: int = 0


@dataclass(slots=True)
class RewardEntry:
    id: NodeIdentity
    earned: int = 0
    slashed: int = 0


@dataclass(slots=True)
class Rewards:
    """Points per epoch (docs/coordinator.md, "Rewards"): the earning rate is shared by the
    epoch's healthy clients."""

    entries: list[RewardEntry] = field(default_factory=list)
    current_earning_rate_total_shared: int = 0
    current_slashing_rate_per_client: int = 0
    future_earning_rate_total_shared: int = 0
    future_slashing_rate_per_client: int = 0


@dataclass(slots=True)
class CoordinatorState:
    run_id: str
    run_state: RunState
    model: LLMConfig
    config: CoordinatorConfig
    progress: Progress = field(default_factory=Progress)
    epoch_state: EpochState = field(default_factory=EpochState)
    run_state_start_unix_timestamp: int = 0
    pending_pause: bool = False
    client_version: str = "latest"
    rewards: Rewards = field(default_factory=Rewards)
    # Epochs that started from the stored checkpoint instead of the model the last epoch's
    # clients held (a P2P checkpoint; none of them came back) after that model had applied
    # training (`model_ahead`): the training since the stored checkpoint is lost, unless an
    # upload moved it. The run says so (TUIs, telemetry, the testnet's summary); u16,
    # saturating.
    model_resets: int = 0
    # The clients' model has applied training since an epoch last started from the stored
    # checkpoint: a round past an epoch's first began (it applies the round before).
    model_ahead: bool = False
    # The model is gone: a warm-up was due, none of the last epoch's clients (the holders
    # of its model) was among the pending ones, and falling back to the stored checkpoint
    # would lose applied training (`model_ahead`). The run stays in WaitingForMembers until
    # a holder joins, a checkpoint report makes the stored checkpoint as new, or the run's
    # authority accepts the loss (`Coordinator.accept_model_loss`).
    model_lost: bool = False

    @property
    def current_round(self) -> Round:
        return self.epoch_state.rounds[self.epoch_state.rounds_head]

    @property
    def previous_round(self) -> Round | None:
        """The round before the current one in this epoch, if any."""
        if self.current_round.height == 0:
            return None
        head = (self.epoch_state.rounds_head + NUM_STORED_ROUNDS - 1) % NUM_STORED_ROUNDS
        return self.epoch_state.rounds[head]

    def client_at(self, index: int, round_clients_len: int) -> Client | None:
        """Who had `index` in a round with `round_clients_len` clients
        (docs/coordinator.md, "Steps, heights and epochs").

        Clients still listed keep their index; the ones that exited since were
        appended to exited_clients, so they are found from its end: offset L - n - 1.
        """
        clients, exited = self.epoch_state.clients, self.epoch_state.exited_clients
        if not 0 <= index < round_clients_len:
            return None
        if index < len(clients):
            return clients[index]
        offset = round_clients_len - index - 1
        if offset < len(exited):
            return exited[len(exited) - 1 - offset]
        return None

    def index_of(self, node: NodeIdentity) -> int | None:
        for index, client in enumerate(self.epoch_state.clients):
            if client.id == node:
                return index
        return None
