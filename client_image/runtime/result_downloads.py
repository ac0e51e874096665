"""Peers' results of a round: announced, downloaded, checked, kept.

A trainer gossips a `ResultAnnouncement` (its batch, the commitment to its payload, the
blob's hash and size). Each announcement of a batch we expect from that sender is
downloaded, from its producer or any other client of the epoch that holds it, and counts
only once its bytes match the commitment and decode against our model; a peer's garbage
is counted and said (`BadResult`), never applied.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from client_image.p2p import ResultAnnouncement
from client_image.runtime.events import BadResult, DownloadFailed
from client_image.runtime.observability import Counters, EventLog
from client_image.runtime.ports import Peers, Worker
from client_image.runtime.rounds import BatchKey, StepRecord, commitment_of
from client_image.runtime.tasks import Spawn

MAX_RESULT_BYTES = 256 * 1024 * 1024


class ResultDownloads:
    def __init__(self, worker: Worker, peers: Peers, events: EventLog, counters: Counters,
                 spawn: Spawn, holders: Callable[[], list[bytes]],
                 on_verified: Callable[[int], Awaitable[None]]):
        self.worker = worker
        self.peers = peers
        self.events = events
        self.counters = counters
        self.spawn = spawn
        self.holders = holders  # the epoch's other clients: who may hold a result too
        self.on_verified = on_verified  # a result of this step now counts

    def on_announcement(self, record: StepRecord, sender: bytes,
                        announcement: ResultAnnouncement) -> None:
        batch = (announcement.batch_id.start, announcement.batch_id.end)
        if not record.expects(batch, sender) or announcement.blob_size > MAX_RESULT_BYTES:
            self.counters.apply_message_ignored += 1
            return
        if not record.announce(batch, announcement.commitment, sender, announcement.blob_hash,
                               announcement.blob_size):
            return
        self.counters.announcements_current += 1
        self.spawn(self._download(record, batch, announcement.commitment),
                   f"download-{record.step}")

    async def _download(self, record: StepRecord, batch: BatchKey, commitment: bytes) -> None:
        announced = record.announced[batch][commitment]
        try:
            data = await self.peers.download_result(
                announced.blob_hash, announced.blob_size, announced.sender, record.step,
                also_from=self.holders())
        except Exception as exc:
            self.counters.apply_message_failure += 1
            self.events.emit(DownloadFailed(step=record.step, batch=batch, error=str(exc)[:200]))
            return
        if commitment_of(record.step, batch, data) != commitment:
            self.counters.apply_message_failure += 1
            self.events.emit(BadResult(step=record.step, batch=batch,
                                       reason="payload does not match its commitment"))
            return
        try:
            await self.worker.decode(data)
        except Exception as exc:  # ResultDecodeError: a peer's garbage never reaches the weights
            self.counters.apply_message_failure += 1
            self.events.emit(BadResult(step=record.step, batch=batch, reason=str(exc)))
            return
        record.record_verified(batch, commitment, data)
        self.counters.downloaded_current += 1
        self.counters.result_bytes_received += len(data)
        await self.on_verified(record.step)
