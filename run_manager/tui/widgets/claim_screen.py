"""The claim confirmation (key c): what will be claimed, to which wallet; Claim or Cancel.

Dismissed with True (Claim, y) or False (Cancel, n, escape); the app sends the claim
transaction only after True.
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ClaimScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Claim"),
        Binding("n", "answer(False)", "Cancel"),
        Binding("escape", "answer(False)", "Cancel"),
    ]

    def __init__(self, question: str, points: int) -> None:
        super().__init__()
        self.question = question
        self.points = points  # what the question shows and a Claim sends

    def compose(self) -> ComposeResult:
        with Vertical(id="claim-dialog"):
            yield Static(self.question, id="claim-question")
            with Horizontal(id="claim-buttons"):
                yield Button("Claim", variant="primary", id="claim-confirm")
                yield Button("Cancel", id="claim-cancel")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "claim-confirm")

    def action_answer(self, confirmed: bool) -> None:
        self.dismiss(confirmed)
