"""Keys of a run config that the coordinator does not use, and how Psyche's are treated.

Psyche reads its TOML with serde, which ignores unknown keys; we refuse them, since a
key that does nothing is a mistake its author should hear about (a misspelt optional key
would otherwise fall back to its default unnoticed), and the message says that Psyche
would have ignored it. What Psyche itself writes is accepted:

- the saved states of Psyche's server (`--save-state-dir` serializes its whole
  `Coordinator`) carry `epoch_state`, `run_state_start_unix_timestamp` and
  `pending_pause`: runtime state that our coordinator rebuilds when a run starts, so they
  are accepted and not used (`PsycheSavedStateKeys`);
- the files Psyche's `update-config --config-path` reads (`config/solana-test/*.toml`)
  hold only [config] and [model]: `STATE_ONLY_KEYS` are the keys of a state file that
  update-config accepts and does not use.

Every `config/*/state.toml` of Psyche parses here without an unknown key.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from coordinator.config_variants import U8, U64

UNKNOWN_KEY = ("unknown key (Psyche ignores unknown keys; psyche-py refuses them so that a "
               "misspelt key is not silently dropped)")

PSYCHE_SAVED_STATE_KEYS = ("epoch_state", "run_state_start_unix_timestamp", "pending_pause")
STATE_ONLY_KEYS = ("run_id", "run_state", "client_version", "progress", *PSYCHE_SAVED_STATE_KEYS)


class PsycheSavedStateKeys(BaseModel):
    """The runtime fields of Psyche's saved states: accepted, checked loosely, never used
    nor written back (`exclude`). `pending_pause` is an integer there: Psyche's
    SmallBoolean is a u8."""

    epoch_state: dict[str, Any] | None = Field(default=None, exclude=True)
    run_state_start_unix_timestamp: U64 | None = Field(default=None, exclude=True)
    pending_pause: U8 | None = Field(default=None, exclude=True)
