"""A joined client's event, applied to the coordinator: what each message asks for.

The server decodes a client's frame (`decode_client_message`) and hands it here with the
sender's identity; the coordinator checks everything else (the run state, whether the
sender may witness, the proof) and says `Rejected` when the event does not apply.
"""

from __future__ import annotations

from collections.abc import Callable

from coordinator import Coordinator, CoordinatorError, NodeIdentity, Rejected
from coordinator_tcp.protocol import (
    CheckpointReport,
    HealthCheck,
    Join,
    VerificationReportMessage,
    WarmupWitness,
    Withdraw,
    WitnessSubmit,
)


def apply_client_event(coordinator: Coordinator, sender: NodeIdentity, message: object,
                       now: int, seed_source: Callable[[], int]) -> Rejected | None:
    """Apply `message` from `sender` at `now`; None when applied (or nothing to do)."""
    if isinstance(message, WarmupWitness):
        return coordinator.warmup_witness(sender, message.witness.to_witness(), now,
                                          seed_source())
    if isinstance(message, WitnessSubmit):
        return coordinator.witness(sender, message.witness.to_witness(), now)
    if isinstance(message, HealthCheck):
        return coordinator.health_check(sender, [c.to_pair() for c in message.checks])
    if isinstance(message, CheckpointReport):
        repo = message.hub or message.gcs
        if repo is None:
            return Rejected(CoordinatorError.InvalidCheckpoint, "neither hub nor gcs given")
        return coordinator.checkpoint(sender, message.index, repo)
    if isinstance(message, VerificationReportMessage):
        return coordinator.verification_report(sender, message.to_report(sender))
    if isinstance(message, Withdraw):
        index = coordinator.state.index_of(sender)
        return None if index is None else coordinator.withdraw(index)
    if isinstance(message, Join):
        return Rejected(CoordinatorError.WrongRunState, "already joined")
    return None
