"""Fetch a training result from any node that holds it, not only from its producer.

    data, provider = await fetch_from_holders(node.blobs, blob_hash, size, producer, others)

Order of asking: holders this node already knows for the hash (fastest first,
with jitter), then the producer. A holder that has uploaded the blob enough
times redirects us to holders it knows, which go to the front of the queue; a
busy one is asked again after a short jittered pause, behind the others. Only
when nobody is left to ask (the producer is gone) are the other clients asked,
one at a time in random order: they may have fetched it. Every answer is verified by its
BLAKE3 hash; a holder that serves wrong bytes (or fails) is skipped for this
blob and forgotten as its holder; a redirect is followed only to peers whose
address this node knows (the run's clients). The number of asks is bounded; when they
are spent, the old path asks the producer and the others without accepting a
redirect (``BlobService.fetch``: retries with backoff), so a result that
exists somewhere is never lost to the redirect logic.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from client_image.p2p.blobs import (
    BlobBusy,
    BlobDownloadError,
    BlobFetchFailed,
    BlobNotFound,
    BlobRedirect,
    BlobService,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HolderFetchConfig:
    max_asks: int = 64
    # a holder we were pointed to may not have stored the blob yet: ask it again this often
    not_found_retries: int = 2
    busy_pause_s: float = 0.02  # first pause after a busy answer; grows with repeats, capped
    busy_pause_max_s: float = 0.5


async def fetch_from_holders(
    service: BlobService,
    digest: bytes,
    size: int,
    producer: bytes,
    others: Sequence[bytes] = (),
    config: HolderFetchConfig | None = None,
) -> tuple[bytes, bytes | None]:
    """The verified blob and the node that served it (None: it was already here)."""
    config = config or HolderFetchConfig()
    local = service.store.get(digest)
    if local is not None:
        return local, None
    service.check_request(digest, size)
    service.stats.started += 1
    me, book = service.transport.node_id, service.holders
    rest = [p for p in others if p != producer]
    random.shuffle(rest)
    queue = [p for p in dict.fromkeys([*book.by_speed(book.holders_of(digest)), producer])
             if p != me]
    reserve = [p for p in rest if p not in queue and p != me]
    skipped: set[bytes] = {me}  # asked and failed: not again in this loop
    liars: set[bytes] = set()  # served wrong bytes: not even in the last resort
    busy_answers: dict[bytes, int] = {}  # busy, or not found at a holder we were sent to
    pointed_to = set(queue) - {producer}
    errors: list[str] = []
    deadline = time.monotonic() + service.config.total_timeout_s
    asks = 0
    while (queue or reserve) and asks < config.max_asks and time.monotonic() < deadline:
        provider = queue.pop(0) if queue else reserve.pop(0)
        asks += 1
        started = time.monotonic()
        try:
            async with service.slots:  # a slot only while bytes may flow, not while waiting
                data = await service.fetch_once(provider, digest, size)
        except BlobRedirect as redirect:
            # only run members (peers whose address we were given): a liar cannot send
            # us dialling made-up ids
            fresh = [h for h in redirect.holders
                     if h not in skipped and service.transport.known_address(h) is not None]
            book.learn(digest, fresh)
            fresh = book.by_speed(fresh)
            pointed_to.update(fresh)
            # the redirecting holder stays a last resort: it does have the blob
            queue = [*fresh, *(p for p in queue if p not in fresh), provider]
            reserve = [p for p in reserve if p not in queue]
            continue
        except (BlobBusy, BlobNotFound) as answer:
            busy_answers[provider] = busy_answers.get(provider, 0) + 1
            if isinstance(answer, BlobNotFound) and (
                provider not in pointed_to or busy_answers[provider] > config.not_found_retries
            ):
                skipped.add(provider)
                errors.append(f"{provider.hex()[:8]}: {answer}")
                continue
            queue.append(provider)
            if all(p in busy_answers for p in queue):  # nobody left that has not said busy
                pause = config.busy_pause_s * 2 ** min(busy_answers[provider] - 1, 5)
                await asyncio.sleep(min(config.busy_pause_max_s, pause) * random.uniform(0.5, 1.5))
            continue
        except BlobFetchFailed as failure:
            errors.append(str(failure))
            skipped.add(provider)
            if failure.wrong_bytes:
                liars.add(provider)
            book.forget_holder(digest, provider)
            continue
        book.record_fetch(provider, time.monotonic() - started)
        book.learn(digest, [provider])
        service.stats.finished += 1
        return data, provider
    if errors:
        logger.info("blob %s: holders failed: %s", digest.hex()[:12], "; ".join(errors[:4]))
    # Last resort: the plain path (retries with backoff), which a holder always serves.
    service.stats.started -= 1  # fetch counts this download itself
    fallback = [p for p in dict.fromkeys([producer, *book.holders_of(digest), *rest])
                if p not in liars and p != me]
    if not fallback:
        service.stats.failed += 1
        raise BlobDownloadError(
            f"blob {digest.hex()[:12]}: every holder served wrong bytes: " + "; ".join(errors[:4])
        )
    return await service.fetch(digest, size, fallback)
