"""The TCP server reads a joined client's wire message in one place
(`coordinator_tcp.server.client_event`): what the client's runtime gave its backend comes
out as the same domain message (coordinator/messages.py), after the frame the TCP backend
sends for it; what carries none is refused."""

from __future__ import annotations

import pytest

from client_image.backends.tcp import DomainMessage, wire_message
from coordinator import (
    Bloom,
    Committee,
    CommitteeProof,
    CoordinatorError,
    NodeIdentity,
    Rejected,
    Witness,
    WitnessProof,
)
from coordinator.config import GcsCheckpoint, HubCheckpoint
from coordinator.messages import (
    CheckpointReport,
    EvalScore,
    HealthCheck,
    RoundWitness,
    WarmupWitness,
    Withdrawal,
    WitnessMetadata,
)
from coordinator.state import VerificationReport
from coordinator_tcp import protocol as wire
from coordinator_tcp.server import client_event

ME, PEER = NodeIdentity(bytes([1]) * 32), NodeIdentity(bytes([2]) * 32)


def received(message: wire.ClientMessage, sender: NodeIdentity = ME) -> object:
    """What the server makes of `message` once it has crossed the wire."""
    return client_event(wire.decode_client_message(wire.encode(message)), sender)


def a_witness() -> Witness:
    bloom = Bloom(keys=(1, 2, 3, 4, 5, 6, 7, 8))
    bloom.add(b"result")
    return Witness(WitnessProof(position=3, index=2, witness=True), participant_bloom=bloom,
                   broadcast_bloom=Bloom(keys=(9, 8, 7, 6, 5, 4, 3, 2)),
                   broadcast_merkle=bytes(range(32)))


@pytest.mark.parametrize("message", [
    RoundWitness(a_witness(), WitnessMetadata(step=7, loss=2.5, tokens_per_sec=1000.0,
                                              bandwidth_per_sec=3.0,
                                              evals=(EvalScore("arc_easy", 0.5),))),
    RoundWitness(a_witness()),
    WarmupWitness(Witness(WitnessProof(position=0, index=0, witness=False))),
    HealthCheck(((PEER, CommitteeProof(Committee.Trainer, 4, 1)),
                 (ME, CommitteeProof(Committee.TieBreaker, 0, 5)))),
    CheckpointReport(index=3, repo=HubCheckpoint(repo_id="org/model", revision="a" * 40)),
    CheckpointReport(index=0, repo=GcsCheckpoint(bucket="ckpts", prefix="run")),
    VerificationReport(reporter=ME, accused=PEER, step=9, published_hash=bytes(32),
                       expected_hash=bytes([7]) * 32, jaccard_ppm=1, hamming_ppm=2,
                       manhattan_ppm=3),
], ids=lambda m: type(m).__name__)
def test_the_server_reads_the_domain_message_the_client_sent(message: DomainMessage) -> None:
    assert received(wire_message(message)) == message


def test_a_verification_report_is_the_senders_whatever_it_claims() -> None:
    report = VerificationReport(reporter=ME, accused=PEER, step=9, published_hash=bytes(32),
                                expected_hash=bytes(32), jaccard_ppm=0, hamming_ppm=0,
                                manhattan_ppm=0)
    event = received(wire_message(report), sender=PEER)
    assert isinstance(event, VerificationReport) and event.reporter == PEER


def test_a_withdraw_is_a_withdrawal() -> None:
    assert received(wire.Withdraw()) == Withdrawal()


def test_a_checkpoint_report_without_a_location_is_refused() -> None:
    event = received(wire.CheckpointReport(index=0))
    assert isinstance(event, Rejected)
    assert event.error is CoordinatorError.InvalidCheckpoint


def test_the_connections_own_messages_ask_nothing_of_the_run() -> None:
    assert received(wire.ResyncAddresses()) is None
    joined_again = client_event(wire.Join(identity=ME.key, run_id="run", p2p_address="p",
                                          signature=bytes(64)), ME)
    assert isinstance(joined_again, Rejected)
    assert joined_again.error is CoordinatorError.WrongRunState
