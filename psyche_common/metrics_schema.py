"""The client's local metrics endpoint: the JSON a client serves on 127.0.0.1:PORT.

`psyche-client train --metrics-local-port PORT` answers each HTTP GET with one
`ClientMetrics` object. The fields are Psyche's (docs/metrics.md, "Local metrics
endpoint") plus what the run-manager's TUI shows (phase, epoch, step, loss, tokens/s,
the sizes of the last results). The client imports this model, so this module imports
nothing but pydantic.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

NonNegativeInt = int


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RoundTripTime(_Strict):
    """A duration as Rust's serde writes `std::time::Duration`."""

    secs: int = Field(ge=0)
    nanos: int = Field(ge=0, lt=1_000_000_000)

    @property
    def seconds(self) -> float:
        return self.secs + self.nanos / 1e9


class SelectedPath(_Strict):
    addr: str
    rtt: RoundTripTime


class ConnectedPeer(_Strict):
    endpoint_id: str
    selected_path: SelectedPath | None = None
    connection_type: Literal["direct", "relay"] | None = None
    """The selected path: straight to the peer, or through a relay server (ours; None
    while no path is selected, and from clients that do not say)."""


RemovalReason = Literal["late-witness", "training-over-time", "health-check", "paused",
                        "withdrawn"]
"""Why the coordinator took a client out of an epoch, as the client infers it
(client_image/runtime/removal.py)."""
REMOVAL_REASONS: tuple[RemovalReason, ...] = get_args(RemovalReason)


class Removal(_Strict):
    """The coordinator took this client out of an epoch."""

    epoch: int = Field(ge=0)
    step: int = Field(ge=0)
    reason: RemovalReason
    detail: str
    """The reason in words, e.g. "a health check dropped it: ..."."""


class ClientMetrics(_Strict):
    """One snapshot of a client's counters, as served on its local metrics port."""

    version: Literal[1] = 1
    """Format version of this object; bumped on incompatible changes."""

    # Psyche's fields (docs/metrics.md, "Local metrics endpoint"), same names and meaning.
    connected_peers: list[ConnectedPeer] = Field(default_factory=list)
    bandwidth: float = Field(default=0.0, ge=0)
    """Bytes per second, all P2P traffic."""
    round_step: int = Field(default=0, ge=0)
    role: Literal["NotInRound", "Trainer", "Witness"] = "NotInRound"
    broadcasts_seen: int = Field(default=0, ge=0)
    apply_message_success: int = Field(default=0, ge=0)
    apply_message_failure: int = Field(default=0, ge=0)
    apply_message_ignored: int = Field(default=0, ge=0)
    finishes_received_current_round: int = Field(default=0, ge=0)
    finishes_received_previous_round: int = Field(default=0, ge=0)
    result_announcements_received_current_round: int = Field(default=0, ge=0)
    result_announcements_received_previous_round: int = Field(default=0, ge=0)
    results_downloaded_current_round: int = Field(default=0, ge=0)
    results_downloaded_previous_round: int = Field(default=0, ge=0)
    witnesses_sent: int = Field(default=0, ge=0)
    gossip_neighbors: list[str] = Field(default_factory=list)
    downloads_started: int = Field(default=0, ge=0)
    downloads_finished: int = Field(default=0, ge=0)
    downloads_retry: int = Field(default=0, ge=0)
    downloads_failed: int = Field(default=0, ge=0)
    downloads_perma_failed: int = Field(default=0, ge=0)
    downloads_bytes: int = Field(default=0, ge=0)

    # P2P traffic (ours): UDP bytes on the current peer connections, for the P2P panel's
    # rates (they go down when connections close).
    p2p_bytes_sent: int = Field(default=0, ge=0)
    p2p_bytes_received: int = Field(default=0, ge=0)
    # The model fetched from peers at warm-up (ours): parameters in hand of those asked,
    # for the run-manager's progress bar; 0 / 0 before any fetch.
    model_params_downloaded: int = Field(default=0, ge=0)
    model_params_total: int = Field(default=0, ge=0)

    # What the run-manager's training panel shows.
    client_version: str = ""
    phase: str = ""
    """The coordinator phase as the client sees it (e.g. "RoundTrain")."""
    epoch: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)
    loss: float | None = None
    """Training loss of the client's last batch; None before the first step."""
    tokens_per_sec: float = Field(default=0.0, ge=0)
    last_result_sizes: list[int] = Field(default_factory=list)
    """Serialized sizes in bytes of the DisTrO results applied at the last step."""

    # Verification (docs/verification.md): what this client's replays of the trainers it
    # follows found, and whether the coordinator ejected this client.
    verification_following: int = Field(default=0, ge=0)
    """Trainers this client follows (replays) in the current epoch; 0 when verification is
    off or this client cannot replay."""
    verifications_passed: int = Field(default=0, ge=0)
    """Followed trainers' results this client's replay reproduced (since the client started)."""
    verifications_failed: int = Field(default=0, ge=0)
    """Followed trainers' results this client's replay did not reproduce."""
    verification_reports_sent: int = Field(default=0, ge=0)
    """Signed verification reports this client sent to the coordinator."""
    ejected: bool = False
    """The coordinator ejected this client: its followers reported its results."""
    ejected_epoch: int | None = None
    """The epoch of the last ejection (None: never ejected)."""
    ejected_by: list[str] = Field(default_factory=list)
    """The followers (node ids, hex) whose reports ejected this client."""

    # Removals (client_image/runtime/removal.py): why the coordinator took it out.
    removals: dict[str, int] = Field(default_factory=dict)
    """Reason -> times this client was taken out of an epoch for it."""
    removal: Removal | None = None
    """The last removal (None: never removed)."""

    # Evals (docs/evals.md): the last score of each task, scored between epochs.
    evals: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Task -> metric (acc, acc_norm) -> the last score, e.g. {"arc_easy": {"acc": 0.5}}."""
