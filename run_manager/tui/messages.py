"""Messages shared across the TUI's widgets."""

from __future__ import annotations

from textual.message import Message

from run_manager.docker_supervisor import SupervisorEvent
from run_manager.monitor import Part


class SupervisorEventPosted(Message):
    """The supervisor reported something (container state, a log line, a pull)."""

    def __init__(self, event: SupervisorEvent) -> None:
        super().__init__()
        self.event = event


class DashboardChanged(Message):
    """A part of the Dashboard (run, training, wallet) has new data."""

    def __init__(self, part: Part) -> None:
        super().__init__()
        self.part = part


class ClientEjected(Message):
    """The coordinator ejected this operator's client; `text` says when, by whom and why."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class FundsClaimed(Message):
    """A mining pool or airdrop claim went through (`text` says what): the transaction's
    fee and a new token account's rent left the wallet's SOL balance."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
