"""Full-screen client logs (key l); escape or l goes back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, RichLog


class LogScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_logs", "Back"),
        Binding("l", "dismiss_logs", "Back"),
    ]

    def __init__(self, lines: Iterable[str]) -> None:
        super().__init__()
        self._initial = list(lines)

    def compose(self) -> ComposeResult:
        self.log_view = RichLog(id="full-log", wrap=False, markup=False, max_lines=10_000)
        yield self.log_view
        yield Footer()

    def on_mount(self) -> None:
        for line in self._initial:
            self.log_view.write(line)

    def append_log(self, text: str) -> None:
        self.log_view.write(text)

    def action_dismiss_logs(self) -> None:
        self.dismiss(None)
