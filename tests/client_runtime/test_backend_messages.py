"""The client's domain messages (coordinator/messages.py) and the TCP backend's wire for
them: every message the runtime gives the typed port reaches the server, decoded as the
server decodes it (`coordinator_tcp.server.apply_client_event`), as the same values."""

from __future__ import annotations

import dataclasses
import time

import pytest

from client_image.backends.tcp import DomainMessage, TcpBackend, wire_message
from coordinator import Bloom, Committee, CommitteeProof, NodeIdentity, Witness, WitnessProof
from coordinator.config import GcsCheckpoint, HubCheckpoint
from coordinator.messages import (
    CheckpointReport,
    EvalScore,
    HealthCheck,
    RoundWitness,
    WarmupWitness,
    WitnessMetadata,
    witness_eval_scores,
)
from coordinator.state import VerificationReport
from coordinator_tcp import protocol as wire
from psyche_common.identity import Identity

ME, PEER = NodeIdentity(bytes([1]) * 32), NodeIdentity(bytes([2]) * 32)


def sent(message: DomainMessage) -> object:
    """What the server decodes from the frame the TCP backend sends for `message`."""
    return wire.decode_client_message(wire.encode(wire_message(message)))


def a_witness(mark: bytes) -> Witness:
    bloom = Bloom(keys=(1, 2, 3, 4, 5, 6, 7, 8))
    bloom.add(mark)
    return Witness(WitnessProof(position=3, index=2, witness=True), participant_bloom=bloom,
                   broadcast_bloom=Bloom(keys=(9, 8, 7, 6, 5, 4, 3, 2)),
                   broadcast_merkle=bytes(range(32)))


def test_a_round_witness_arrives_with_its_blooms_and_metadata() -> None:
    metadata = WitnessMetadata(step=7, loss=2.5, tokens_per_sec=1000.0,
                               evals=(EvalScore("arc_easy", 0.5),))
    decoded = sent(RoundWitness(a_witness(b"result"), metadata))
    assert isinstance(decoded, wire.WitnessSubmit)
    assert decoded.witness.to_witness() == a_witness(b"result")
    assert decoded.witness.to_witness() != a_witness(b"another result")
    assert (decoded.metadata.step, decoded.metadata.loss, decoded.metadata.tokens_per_sec) == (
        7, 2.5, 1000.0)
    assert [(e.name, e.value) for e in decoded.metadata.evals] == [("arc_easy", 0.5)]


def test_a_warmup_witness_arrives_as_a_warmup_witness() -> None:
    witness = Witness(WitnessProof(position=0, index=0, witness=False))
    decoded = sent(WarmupWitness(witness))
    assert isinstance(decoded, wire.WarmupWitness)
    assert decoded.witness.to_witness() == witness


def test_a_health_check_arrives_as_the_same_pairs() -> None:
    checks = ((PEER, CommitteeProof(Committee.Trainer, 4, 1)),
              (ME, CommitteeProof(Committee.TieBreaker, 0, 5)))
    decoded = sent(HealthCheck(checks))
    assert isinstance(decoded, wire.HealthCheck)
    assert tuple(entry.to_pair() for entry in decoded.checks) == checks


@pytest.mark.parametrize("repo", [HubCheckpoint(repo_id="org/model", revision="a" * 40),
                                  GcsCheckpoint(bucket="ckpts", prefix="run")])
def test_a_checkpoint_report_arrives_naming_its_repository(
        repo: HubCheckpoint | GcsCheckpoint) -> None:
    decoded = sent(CheckpointReport(index=3, repo=repo))
    assert isinstance(decoded, wire.CheckpointReport)
    assert (decoded.index, decoded.hub or decoded.gcs) == (3, repo)
    assert (decoded.hub is None) == isinstance(repo, GcsCheckpoint)


def test_a_verification_report_arrives_attributed_to_the_connections_key() -> None:
    report = VerificationReport(reporter=ME, accused=PEER, step=9, published_hash=bytes(32),
                                expected_hash=bytes([7]) * 32, jaccard_ppm=1, hamming_ppm=2,
                                manhattan_ppm=3)
    decoded = sent(report)
    assert isinstance(decoded, wire.VerificationReportMessage)
    assert decoded.to_report(ME) == report  # the server names the reporter: the sender


def test_domain_messages_are_values() -> None:
    report = CheckpointReport(index=0, repo=GcsCheckpoint(bucket="b"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.index = 1  # type: ignore[misc]  # assigning a frozen field is the point
    assert report == CheckpointReport(index=0, repo=GcsCheckpoint(bucket="b"))


def test_a_witness_carries_at_most_eight_eval_scores_by_their_psyche_metric() -> None:
    scores = {f"task{i}": {"acc": i / 10} for i in range(10)}
    scores["arc_easy"] = {"acc": 0.1, "acc_norm": 0.75}
    scores["x" * 40] = {"acc": 1.0}
    scores["no_metric"] = {"f1": 0.3}
    picked = witness_eval_scores(scores)
    assert len(picked) <= 8 and picked[0] == EvalScore("arc_easy", 0.75)  # acc_norm first
    assert EvalScore("no_metric", 0.3) not in picked
    assert witness_eval_scores({"x" * 40: {"acc": 1.0}})[0].name == "x" * 32
    # The wire keeps the same selection.
    assert [(e.name, e.value) for e in wire.WitnessMetadata.evals_of(scores)] == [
        (score.name, score.value) for score in picked]


async def test_the_tcp_backend_withdraws_only_over_a_connection_that_is_up() -> None:
    """A stopping client does not wait for a coordinator it cannot reach (the runtime no
    longer checks which backend it has: the backend decides)."""
    backend = TcpBackend("127.0.0.1:1", Identity(bytes(31) + b"\x05"), "run", "p2p",
                         reconnect_wait_s=30)
    started = time.monotonic()
    assert await backend.withdraw() is False
    assert time.monotonic() - started < 1  # not the 30 s a queued message would wait
