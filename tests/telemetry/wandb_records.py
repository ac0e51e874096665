"""Reads a W&B offline run's transaction log (`run-<id>.wandb`) with wandb's own protobuf
`Record` class, for the W&B tests.

wandb 0.31 ships no Python reader of this file (its Go core writes and syncs it), so the
framing is read here: a 7-byte header (":W&B", magic 0xBEE1, version 0), then LevelDB
log-format blocks of 32 KiB, each record chunk with a 7-byte header (CRC32, length, type:
1 full, 2 first, 3 middle, 4 last); a block's tail too short for a header is padding.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

# The generated protobuf module has no type stubs: its classes are Any to mypy.
pb: Any = wandb_internal_pb2

BLOCK = 32 * 1024
FILE_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    data = path.read_bytes()
    assert data[:7] == FILE_HEADER, f"{path} is not a W&B transaction log"
    found: list[Any] = []
    pending = b""
    offset = 7
    while offset + 7 <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < 7:  # padding at a block's end
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:  # zeroed tail of a preallocated block
            offset += BLOCK - offset % BLOCK if offset % BLOCK else 0
            continue
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


@dataclass
class OfflineRun:
    run: Any  # wandb_internal_pb2.RunRecord
    history: list[dict[str, Any]] = field(default_factory=list)

    def by_step(self) -> dict[int, dict[str, Any]]:
        return {row["_step"]: row for row in self.history}


def read_offline_run(wandb_dir: Path) -> OfflineRun:
    """The one offline run under WANDB_DIR: its run record and history rows."""
    logs = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, f"one offline run expected under {wandb_dir}: {logs}"
    run: Any = None
    history: list[dict[str, Any]] = []
    for record in records(logs[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                            for item in record.history.item})
    assert run is not None, "no run record"
    return OfflineRun(run, history)
