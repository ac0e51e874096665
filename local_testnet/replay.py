"""A run rebuilt from its event files (`--events-dir` of the coordinator and the clients,
psyche_common.event_files): what `psyche-testnet replay` shows.

`RunReplay` applies records in order: the coordinator's `state` records give the run's
state (decoded whole: the TUI shows it as the testnet's own screen does), `joined` /
`left` who is connected, `refused` the events the coordinator turned down; each client's
records give its phase, epoch, step and loss by step. `Playback` hands out records as
the replay's clock reaches them: `speed` times as fast as they happened (0: at once).

    replay = RunReplay()
    for record in read_events(Path("events")).records:
        replay.apply(record)
    replay.summary()  # {"run_state": "Finished", "step": 20, "clients": {...}, ...}
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from coordinator import CoordinatorState
from coordinator_tcp.event_recording import SOURCE as COORDINATOR
from coordinator_tcp.event_recording import state_of
from local_testnet.client_log import describe_line
from psyche_common.event_files import BadLine, EventRecord

RECENT_LINES = 200  # event lines in words kept for the log pane


@dataclass
class ReplayClient:
    source: str
    identity: str = ""  # hex key, from its `opened` record
    phase: str = ""
    epoch: int = 0
    step: int = 0
    loss: float | None = None
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss it trained
    finished: bool = False
    last: str = ""  # its last event, in words


@dataclass
class RunReplay:
    state: CoordinatorState | None = None
    state_time: float = 0.0  # when the coordinator recorded `state`
    time: float = 0.0  # the last applied record's time
    clients: dict[str, ReplayClient] = field(default_factory=dict)
    connected: set[str] = field(default_factory=set)  # hex keys of joined clients
    refused: int = 0
    records: int = 0
    bad: list[BadLine] = field(default_factory=list)
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_LINES))

    said: int = 0  # lines said so far (`lines` keeps the last RECENT_LINES)

    def _say(self, line: str) -> None:
        self.lines.append(line)
        self.said += 1

    def new_lines(self, shown: int) -> list[str]:
        """The lines said since `shown` of them were (at most the RECENT_LINES last)."""
        new = min(len(self.lines), self.said - shown)
        return list(self.lines)[len(self.lines) - new:] if new > 0 else []

    def apply(self, record: EventRecord) -> None:
        self.records += 1
        self.time = max(self.time, record.time)
        if record.source == COORDINATOR:
            self._coordinator(record)
        else:
            self._client(record)

    def add_bad(self, lines: Iterable[BadLine]) -> None:
        for line in lines:
            self.bad.append(line)
            self._say(f"events: {line.describe()}")

    def _coordinator(self, record: EventRecord) -> None:
        payload = record.payload
        if record.kind == "state":
            try:
                self.state, self.state_time = state_of(record), record.time
            except ValueError as exc:
                self._say(f"coordinator: {exc}")
            return
        identity = str(payload.get("identity", ""))
        if payload.get("observer") and record.kind != "refused":
            return  # an observer connecting or leaving says nothing of the run
        if record.kind == "joined":
            self.connected.add(identity)
        elif record.kind == "left":
            self.connected.discard(identity)
        elif record.kind == "refused":
            self.refused += 1
        if record.kind in ("joined", "left", "refused"):
            detail = f" {payload.get('error')}: {payload.get('detail')}" if (
                record.kind == "refused") else ""
            self._say(f"coordinator: {record.kind} {identity[:16]}{detail}")

    def _client(self, record: EventRecord) -> None:
        client = self.clients.setdefault(record.source, ReplayClient(record.source))
        payload = record.payload
        match record.kind:
            case "opened":
                client.identity = str(payload.get("identity", ""))
            case "state":
                client.phase = str(payload.get("phase", ""))
                client.epoch = _int(payload.get("epoch"), client.epoch)
                client.step = _int(payload.get("step"), client.step)
            case "trained":
                step, loss = payload.get("step"), payload.get("loss")
                if isinstance(step, int) and isinstance(loss, int | float):
                    client.losses[step] = float(loss)
                    client.loss = float(loss)
            case "finished":
                client.finished = True
                client.step = _int(payload.get("step"), client.step)
        # In the shape of a `--logs json` line, so that it reads as the testnet's logs do.
        client.last = describe_line(json.dumps({"event": record.kind, **payload}, default=str))
        self._say(f"{record.source}: {client.last}")

    def summary(self) -> dict[str, Any]:
        """The run as the files tell it, one JSON-able dict."""
        state = self.state
        by_step: dict[int, list[float]] = {}
        for client in self.clients.values():
            for step, loss in client.losses.items():
                by_step.setdefault(step, []).append(loss)
        steps = sorted(by_step)
        return {
            "run_state": state.run_state.name if state else None,
            "step": state.progress.step if state else None,
            "epoch": state.progress.epoch if state else None,
            "clients": {source: {"identity": c.identity, "trained_steps": len(c.losses),
                                 "last_step": max(c.losses, default=None),
                                 "last_loss": c.loss, "finished": c.finished}
                        for source, c in sorted(self.clients.items())},
            "first_loss": _mean(by_step[steps[0]]) if steps else None,
            "last_loss": _mean(by_step[steps[-1]]) if steps else None,
            "records": self.records,
            "refused": self.refused,
            "bad_lines": [line.describe() for line in self.bad],
        }


class Playback:
    """Records in time order, handed out as the replay's clock passes them: the clock
    starts at the first record and runs `speed` times as fast as the wall clock
    (0: every record at once)."""

    def __init__(self, speed: float, clock: Any = time.monotonic) -> None:
        self.speed = speed
        self.clock = clock
        self.queue: deque[EventRecord] = deque()
        self.start_time: float | None = None  # the first record's time
        self.started: float = 0.0  # the wall clock then

    def add(self, records: Iterable[EventRecord]) -> None:
        for record in records:
            if self.start_time is None:
                self.start_time, self.started = record.time, self.clock()
            self.queue.append(record)

    @property
    def position_s(self) -> float:
        """Seconds of the run replayed so far."""
        if self.start_time is None:
            return 0.0
        return (self.clock() - self.started) * self.speed

    def due(self) -> list[EventRecord]:
        if self.start_time is None:
            return []
        if self.speed <= 0:
            out = list(self.queue)
            self.queue.clear()
            return out
        until = self.start_time + self.position_s
        out = []
        while self.queue and self.queue[0].time <= until:
            out.append(self.queue.popleft())
        return out


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) else default


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
