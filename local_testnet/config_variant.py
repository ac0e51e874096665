"""A copy of a testnet config with `[config]` overrides (tests and benchmarks run the
default local-testnet config with a few values changed)."""

from __future__ import annotations

from pathlib import Path

from coordinator import load_data_config, load_state_file
from coordinator.config import ServerDataLocation

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "config" / "local-testnet"


def write_config_variant(directory: Path, data_port: int, source: Path = DEFAULT_CONFIG,
                         **config: int) -> Path:
    """`source`'s state.toml with `[config]` overrides and its data served on `data_port`,
    and its data.toml with an absolute data dir, written to `directory` (returned)."""
    state = load_state_file(source / "state.toml")
    model = state.model.model_copy(update={
        "data_location": ServerDataLocation(address=f"127.0.0.1:{data_port}")})
    state = state.model_copy(update={"config": state.config.model_copy(update=config),
                                     "model": model})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "state.toml").write_text(state.to_toml())
    load_state_file(directory / "state.toml")  # the overrides must still be a valid config
    data = load_data_config(source / "data.toml")
    data_dir = Path(data.dir)  # load_data_config resolves it against its file
    seed = ", ".join(str(b) for b in data.shuffle_seed)
    (directory / "data.toml").write_text(
        f'dir = "{data_dir.resolve()}"\ntoken_size = "{data.token_size.name}"\n'
        f"seq_len = {data.seq_len}\nshuffle_seed = [{seed}]\n")
    return directory
