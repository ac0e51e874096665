import ctypes
import os
from collections.abc import Callable
from typing import Any, TypeVar

from iroh import iroh_ffi

from client_image.p2p import iroh_patch

_Payload = TypeVar("_Payload", bytes, bytearray, memoryview)


def _copy_with(write: Callable[[Any, _Payload], None], payloads: list[_Payload]) -> bytes:
    builder = iroh_ffi._UniffiRustBufferBuilder()
    try:
        for payload in payloads:
            write(builder, payload)
            builder.write_u32(len(payload))  # interleave with the builder's own writes
        buffer = builder.rbuf
        return ctypes.string_at(buffer.data, buffer.len)
    finally:
        builder.discard()


def test_patch_is_active_after_importing_the_package() -> None:
    assert iroh_patch.installed_iroh_version() == iroh_patch.PATCHED_IROH_VERSION
    assert iroh_patch.bulk_write_patch_active()


def test_bulk_copy_produces_the_same_buffer_as_the_original() -> None:
    # sizes cross the builder's growth points, including empty and odd sizes
    payloads = [b"", b"a", os.urandom(15), os.urandom(17), os.urandom(70_001), os.urandom(3)]
    original = _copy_with(iroh_patch.ORIGINAL_WRITE, payloads)
    patched = _copy_with(iroh_patch.bulk_write, payloads)
    assert patched == original
    assert len(patched) == sum(len(p) + 4 for p in payloads)


def test_bulk_copy_accepts_bytearray_and_memoryview() -> None:
    data = os.urandom(1000)
    assert _copy_with(iroh_patch.bulk_write, [bytearray(data)]) == _copy_with(
        iroh_patch.bulk_write, [data]
    )
    assert _copy_with(iroh_patch.bulk_write, [memoryview(data)])[:1000] == data


def test_other_binding_versions_are_left_alone() -> None:
    try:
        iroh_patch.remove_bulk_write_patch()
        assert not iroh_patch.apply_bulk_write_patch(version="1.3.0")
        assert not iroh_patch.bulk_write_patch_active()
        assert iroh_patch.apply_bulk_write_patch()
    finally:
        iroh_patch.apply_bulk_write_patch()
    assert iroh_patch.bulk_write_patch_active()
