"""Fixed limits and the two state enums of the coordinator.

The limits are those of the on-chain account (docs/coordinator.md, "State layout"): the
C program mirrors the same fixed-size arrays, so they are part of the wire format.
"""

from __future__ import annotations

from enum import IntEnum

MAX_CLIENTS = 256  # epoch_state.clients and exited_clients capacity
MAX_WITNESSES = 32  # Round.witnesses capacity
NUM_STORED_ROUNDS = 4  # the ring of rounds in epoch_state
RUN_ID_MAX_BYTES = 32
STRING_MAX_BYTES = 64  # repo ids, buckets, prefixes, revisions
URL_MAX_BYTES = 192
CLIENT_VERSION_MAX_BYTES = 96
BLOOM_WORDS = 16  # 16 u64 words = 1024 bits
BLOOM_KEYS = 8


class RunState(IntEnum):
    """Phase of a run; the integer is the on-chain u8."""

    Uninitialized = 0
    WaitingForMembers = 1
    Warmup = 2
    RoundTrain = 3
    RoundWitness = 4
    Cooldown = 5
    Finished = 6
    Paused = 7

    @property
    def halted(self) -> bool:
        return self in (RunState.Uninitialized, RunState.Finished, RunState.Paused)

    @property
    def active(self) -> bool:
        return self in (RunState.RoundTrain, RunState.RoundWitness, RunState.Cooldown)


class ClientState(IntEnum):
    """State of one client in the epoch; Ejected exists on-chain but is never assigned."""

    Healthy = 0
    Dropped = 1
    Withdrawn = 2
    Ejected = 3
