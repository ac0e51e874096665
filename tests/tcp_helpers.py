"""Helpers for the TCP backend tests: a short-timed run config, keys, joining."""

from __future__ import annotations

import asyncio
import base64
import tomllib
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.config import StateFile, state_file_from_dict
from coordinator_tcp.client import ProtocolConnection
from coordinator_tcp.protocol import ResyncAddresses, StateUpdate
from coordinator_tcp.server import CoordinatorServer, ServerOptions
from coordinator_tcp.state_delta import StateMirror
from psyche_common.identity import Identity

ROOT = Path(__file__).resolve().parents[1]
TESTNET = ROOT / "config" / "local-testnet"
RUN_ID = "local-testnet"


def make_state_file(**config: Any) -> StateFile:
    """The local-testnet state with [config] overrides (short times for tests)."""
    data = tomllib.loads((TESTNET / "state.toml").read_text())
    data["config"].update({"init_min_clients": 1, "min_clients": 1, "warmup_time": 2,
                           "waiting_for_members_extra_time": 1, "max_round_train_time": 2,
                           "round_witness_time": 1, "cooldown_time": 1, "epoch_time": 30})
    model = config.pop("model", {})
    data["config"].update(config)
    data["model"]["LLM"].update(model)
    return state_file_from_dict(data)


def identity(i: int) -> Identity:
    return Identity(i.to_bytes(32, "big"))


def server_options(**overrides: Any) -> ServerOptions:
    options = ServerOptions(host="127.0.0.1", port=0, tick_interval_s=0.05,
                            heartbeat_interval_s=0.5, handshake_timeout_s=2.0)
    for key, value in overrides.items():
        setattr(options, key, value)
    return options


async def join(server: CoordinatorServer, who: Identity, *, observe: bool = False,
               address: str = "") -> ProtocolConnection:
    connection, _welcome = await ProtocolConnection.connect(
        "127.0.0.1", server.port, who, RUN_ID, address or f"{who.node_id}@127.0.0.1:1",
        observe=observe, timeout_s=5)
    return connection


# Each connection's copy of the server's state: clients are sent patches after the first.
_MIRRORS: weakref.WeakKeyDictionary[ProtocolConnection, StateMirror] = (
    weakref.WeakKeyDictionary())


async def next_state(connection: ProtocolConnection, timeout_s: float = 5.0) -> StateUpdate:
    """The next StateUpdate (heartbeats skipped), with `state` whole: a patch is applied
    to the connection's copy (a gap asks for the whole state and waits for it)."""

    async def wait() -> StateUpdate:
        mirror = _MIRRORS.setdefault(connection, StateMirror())
        while True:
            message = await connection.receive()
            if not isinstance(message, StateUpdate):
                continue
            data, ask = mirror.apply(message)
            if ask:
                await connection.send(ResyncAddresses())
            if data is not None:
                return message.model_copy(update={"state": base64.b64encode(data).decode()})

    return await asyncio.wait_for(wait(), timeout_s)


class Clock:
    """The server's clock in a test: seconds that move only when the test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def wait_for(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Poll `condition` every 20 ms until it holds; AssertionError after `timeout_s`."""
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")
