"""`psyche-testnet replay`: a run shown again from its event files, in the testnet TUI's
views: the coordinator's state (phase and timer on the run's clock, clients, witnesses),
a row per client (phase, epoch, step, loss, steps trained, its part in the witnessing,
its last event in words), the loss by step and the events in words.

A finished run plays from its first record at `--speed` (0: all at once); with
`--follow` the files are read again every half second and new records (a live run, or
one still writing) join the playback. The status line says where the replay is, and
names every line of the files that is not a record: a torn last line of a killed
writer is shown as such, never a crash. `q` quits.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import DataTable, Footer, Header, RichLog, Static

from coordinator_tcp.summary import summarize
from local_testnet.replay import Playback, RunReplay
from local_testnet.widgets import LossPlot, mean_losses
from local_testnet.witness_state import witness_states
from psyche_common.event_files import EventFollower

FOLLOW_POLL_S = 0.5
STATUS_WIDTH = 60


class ReplayApp(App[None]):
    TITLE = "psyche replay"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "quit")]
    CSS = """
    #server, #replay { height: auto; padding: 0 1; border: round $accent; }
    #clients { height: auto; max-height: 12; }
    #below { height: 1fr; min-height: 10; }
    #loss, #events { width: 1fr; border: round $primary; border-title-color: $accent; }
    """

    def __init__(self, directory: Path, *, speed: float = 1.0, follow: bool = False,
                 refresh_s: float = 0.1) -> None:
        super().__init__()
        self.directory = directory
        self.follow = follow
        self.refresh_s = refresh_s
        self.replay = RunReplay()
        self.playback = Playback(speed)
        self.follower = EventFollower(directory)
        self._last_poll = 0.0
        self._shown_lines = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("reading the event files…", id="replay")
        yield Static("no coordinator state yet", id="server")
        yield DataTable(id="clients")
        with Horizontal(id="below"):
            yield LossPlot(id="loss")
            yield RichLog(id="events", max_lines=1000, wrap=True, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#events", RichLog).border_title = "Events"
        self.query_one("#clients", DataTable).add_columns(
            "client", "phase", "epoch", "step", "loss", "trained", "witness", "last event")
        self.read_files()
        self.set_interval(self.refresh_s, self.tick)

    def read_files(self) -> None:
        """New records of the files: everything at once for a finished run (a partial
        last line is torn), what was appended since for a followed one."""
        records, bad = self.follower.poll(final=not self.follow)
        self.playback.add(records)
        self.replay.add_bad(bad)
        self._last_poll = time.monotonic()

    def tick(self) -> None:
        if not self.is_running:  # shutting down: the timer can fire after the widgets went
            return
        if self.follow and time.monotonic() - self._last_poll >= FOLLOW_POLL_S:
            self.read_files()
        for record in self.playback.due():
            self.replay.apply(record)
        self.refresh_view()

    def replay_text(self) -> str:
        replay, playback = self.replay, self.playback
        left = len(playback.queue)
        where = ("following the files" if self.follow else
                 "at the end" if not left else f"{left} records to go")
        speed = "at once" if playback.speed <= 0 else f"{playback.speed:g}x"
        # The run's time of the last record replayed, from its first record.
        at = replay.time - playback.start_time if playback.start_time is not None else 0.0
        lines = [f"replay of {self.directory}  {speed}  t+{max(at, 0.0):.1f}s  "
                 f"records {replay.records}  {where}"]
        lines += [line.describe() for line in replay.bad[-3:]]
        return "\n".join(lines)

    def server_text(self) -> str:
        state = self.replay.state
        if state is None:
            return "no coordinator state yet"
        now = self.replay.time if self.playback.speed <= 0 else max(
            self.replay.time, (self.playback.start_time or 0) + self.playback.position_s)
        s = summarize(state, now, joined=len(self.replay.connected))
        run = [s.waiting] if s.waiting else []
        if s.phase not in ("Uninitialized", "WaitingForMembers"):
            run.append(f"clients {len(s.clients)}  witnesses {s.witnesses}/{s.witness_target}"
                       f" (quorum {s.quorum})")
        return (f"run {s.run_id}  phase {s.phase} {s.phase_timer}  epoch {s.epoch}  "
                f"step {s.step}/{s.total_steps}\n" + "  ·  ".join(run)
                + f"\nconnected {len(self.replay.connected)}  refused {self.replay.refused}")

    def refresh_view(self) -> None:
        replay = self.replay
        self.query_one("#replay", Static).update(self.replay_text())
        self.query_one("#server", Static).update(self.server_text())
        clients = sorted(replay.clients.values(), key=lambda c: c.source)
        witness = witness_states(replay.state, {
            i: bytes.fromhex(c.identity) for i, c in enumerate(clients) if _is_hex(c.identity)})
        table = self.query_one("#clients", DataTable)
        table.clear()
        for i, client in enumerate(clients):
            loss = "" if client.loss is None else f"{client.loss:.3f}"
            table.add_row(client.source, client.phase, str(client.epoch), str(client.step),
                          loss, str(len(client.losses)), witness.get(i, ""),
                          _clip(client.last, STATUS_WIDTH))
        self.query_one(LossPlot).show(mean_losses(c.losses for c in clients))
        log = self.query_one("#events", RichLog)
        for line in replay.new_lines(self._shown_lines):
            log.write(line)
        self._shown_lines = replay.said


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return bool(text)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
