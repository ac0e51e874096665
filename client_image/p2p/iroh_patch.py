"""Import-time fix for the slow byte copy in the iroh 1.2.0 Python binding.

Why: every ``SendStream.write`` / ``write_all`` lowers its ``bytes`` argument
through ``_UniffiRustBufferBuilder.write``, which copies into the Rust buffer
one byte at a time in a Python loop (``self.rbuf.data[len + i] = byte``).
That loop, not QUIC, capped a bulk stream at about 9 MB/s on loopback with a
core at 100 %. The read side already copies in bulk.

What: replace that one method by a bulk ``ctypes.memmove`` into the buffer
after the builder's own ``_reserve`` (which grows the Rust allocation and
bumps ``len``), so the produced buffer is byte-for-byte the same. The patch is
applied only to the exact binding version it was written against
(``PATCHED_IROH_VERSION``); any other version is left untouched, because the
private helper may have changed shape. ``tests/p2p/test_iroh_patch.py`` checks
that patched and original copies produce identical buffers.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

from iroh import iroh_ffi

logger = logging.getLogger(__name__)

PATCHED_IROH_VERSION = "1.2.0"

_builder_cls: Any = iroh_ffi._UniffiRustBufferBuilder
ORIGINAL_WRITE: Callable[[Any, bytes], None] = _builder_cls.write


def bulk_write(self: Any, value: bytes | bytearray | memoryview) -> None:
    """Drop-in for ``_UniffiRustBufferBuilder.write`` that copies with one memmove."""
    size = len(value)
    with self._reserve(size):
        if size:
            # data is POINTER(c_char); the write offset is the length before _reserve bumps it.
            destination = ctypes.addressof(self.rbuf.data.contents) + self.rbuf.len
            source = value if isinstance(value, bytes) else bytes(value)
            ctypes.memmove(destination, source, size)


def installed_iroh_version() -> str:
    return importlib.metadata.version("iroh")


def apply_bulk_write_patch(version: str | None = None) -> bool:
    """Install the bulk copy when the binding is ``PATCHED_IROH_VERSION``.

    Returns True when the patch is (now) active. Idempotent.
    """
    version = installed_iroh_version() if version is None else version
    if version != PATCHED_IROH_VERSION:
        logger.warning(
            "iroh %s is not %s: leaving its byte-by-byte buffer copy unpatched (slow writes)",
            version,
            PATCHED_IROH_VERSION,
        )
        return False
    _builder_cls.write = bulk_write
    return True


def remove_bulk_write_patch() -> None:
    """Restore the binding's original copy (used by the benchmark's 'unpatched' run)."""
    _builder_cls.write = ORIGINAL_WRITE


def bulk_write_patch_active() -> bool:
    return _builder_cls.write is bulk_write
