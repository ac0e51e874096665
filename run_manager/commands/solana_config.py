"""The file `update-config --config-path` reads: [config] and [model], as Psyche's does.

Psyche's update-config deserializes only `{config, model}` from the file, so its
solana-test configs have no `run_id` or `run_state`. We accept such files and full
state files alike (their other keys, coordinator.config_keys.STATE_ONLY_KEYS, are not
used: the run is `-r`'s), and keep refusing keys that belong to no run config. A state
key that looks meant to take effect (another run id, a progress, a client version) gets
a note saying it does not.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.config import ConfigError, CoordinatorConfig, LLMConfig, state_file_from_dict
from coordinator.config_keys import STATE_ONLY_KEYS

# Stand-ins for the state-file keys update-config does not use, so that the rest of the
# file goes through every rule of a state file (all problems at once, same messages).
_PLACEHOLDERS = {"run_id": "update-config", "run_state": "Paused"}


@dataclass(frozen=True)
class RunConfigUpdate:
    config: CoordinatorConfig
    model: LLMConfig
    notes: list[str] = field(default_factory=list)
    """One line per key of the file that is accepted but not applied and looks meant to be."""


def load_run_config(path: Path, run_id: str, client_version: str | None) -> RunConfigUpdate:
    """[config] and [model] of `path`; ConfigError lists every problem, each led by the path."""
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError([f"{path}: cannot read: {error}"]) from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"{path}: TOML syntax error: {error}"]) from None
    unused = {key: data.pop(key) for key in STATE_ONLY_KEYS if key in data}
    try:
        state = state_file_from_dict({**data, **_PLACEHOLDERS})
    except ConfigError as error:
        raise ConfigError([f"{path}: {message}" for message in error.errors]) from None
    notes = []
    if "run_id" in unused and unused["run_id"] != run_id:
        notes.append(f"{path} names run_id {unused['run_id']!r}; it is not used: this updates "
                     f"run {run_id!r} (-r)")
    if "progress" in unused:
        notes.append(f"{path}: [progress] is not applied: update-config sets [config] and "
                     "[model] only, as Psyche's does")
    if "client_version" in unused and client_version is None:
        notes.append(f"{path}: client_version is not applied: pass --client-version to set it")
    return RunConfigUpdate(state.config, state.model, notes)
