"""Pools & airdrops: the mining pools this wallet lent to (deposited, its share of the
rewards, claimed, claimable) and its allocations in the airdrops of the proofs files
AIRDROP_PROOFS names (allocated, vested, claimed, claimable), read from the chain by
run_manager.funds on mount and at every wallet refresh; a line says when no proofs file
is set. Key a (or enter on a row) claims the highlighted row's claimable amount after a
confirmation (FundsClaimScreen) that shows the exact amount the transaction sends.

Shown in Solana runs with a wallet only (the app hands it a WalletFunds); hidden otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from run_manager.tui.messages import FundsClaimed
from run_manager.tui.widgets.funds_claim_screen import FundsClaimScreen

if TYPE_CHECKING:  # solders loads only for Solana runs
    from run_manager.funds import FundsStatus, Stake, WalletFunds


def _units(amount: int, decimals: int) -> str:
    from psyche_solana.rewards import format_units

    return format_units(amount, decimals)


def _short(key: object) -> str:
    text = str(key)
    return f"{text[:4]}…{text[-4:]}"


def stake_cells(stake: Stake) -> tuple[str, ...]:
    """A row of the panel: what, deposited or allocated, share or vested, claimed,
    claimable (token units of each figure's mint), and the state when nothing is."""
    from run_manager.funds import PoolStake

    if isinstance(stake, PoolStake):
        part = (f"{stake.deposited * 100 / stake.pool_deposited:.3g}% of "
                f"{_units(stake.pool_deposited, stake.collateral_decimals)}"
                if stake.pool_deposited else "of 0")
        reward = stake.redeemable_decimals
        state = (f"reward {_short(stake.redeemable_mint)}" if stake.claimable
                 else stake.why_nothing)
        return (f"pool {stake.index}",
                f"deposited {_units(stake.deposited, stake.collateral_decimals)} ({part})",
                f"share {_units(stake.share, reward)}", f"claimed {_units(stake.claimed, reward)}",
                f"claimable {_units(stake.claimable, reward)}", state)
    decimals = stake.decimals
    return (f"airdrop {stake.airdrop_id} #{stake.nonce}",
            f"allocated {_units(stake.allocated, decimals)}",
            f"vested {_units(stake.vested, decimals)}", f"claimed {_units(stake.claimed, decimals)}",
            f"claimable {_units(stake.claimable, decimals)}",
            f"token {_short(stake.mint)}" if stake.claimable else stake.why_nothing)


def claim_question(stake: Stake, amount: int, wallet: str) -> str:
    """The confirmation's text: the exact amount (base units and token units) and its source."""
    from run_manager.funds import PoolStake

    if isinstance(stake, PoolStake):
        mint, decimals = stake.redeemable_mint, stake.redeemable_decimals
        source = f"mining pool {stake.index} (this wallet's share of its rewards)"
    else:
        mint, decimals = stake.mint, stake.decimals
        source = f"airdrop {stake.airdrop_id}, allocation #{stake.nonce} (vested so far)"
    return (f"Claim {amount} base units = {_units(amount, decimals)} tokens ({mint})\n"
            f"from {source}\nto wallet {wallet}?\n\n"
            "This sends a transaction signed by the wallet.")


class FundsPanel(Vertical):
    BORDER_TITLE = "Pools & airdrops"
    DEFAULT_CSS = """
    FundsPanel {
        height: auto;
        max-height: 14;
        border: round $primary;
        border-title-color: $accent;
        border-title-style: bold;
    }
    FundsPanel #funds-notes {
        height: auto;
    }
    FundsPanel #funds-table {
        height: auto;
        max-height: 8;
    }
    """

    def __init__(self, funds: WalletFunds | None, refresh_s: float, *, id: str | None = None) -> None:  # noqa: A002 (Textual's name)
        super().__init__(id=id)
        self.funds = funds
        self.refresh_s = refresh_s
        self.status: FundsStatus | None = None
        self.error = ""
        self.last_claim = ""
        self.rows: list[Stake] = []  # the table's rows, in order

    def compose(self) -> ComposeResult:
        self.notes = Static("pools and airdrops: reading the chain…", id="funds-notes")
        self.table: DataTable[str] = DataTable(id="funds-table", show_header=False,
                                               cursor_type="row")
        self.table.add_columns("what", "in", "out", "claimed", "claimable", "state")
        yield self.notes
        yield self.table

    def on_mount(self) -> None:
        self.display = self.funds is not None
        if self.funds is not None:
            self.refresh_funds()
            self.set_interval(self.refresh_s, self.refresh_funds)

    @work(exclusive=True, group="funds")
    async def refresh_funds(self) -> None:
        await self.read()

    async def read(self) -> None:
        """The pools and airdrops from the chain, redrawn."""
        from run_manager.funds import FundsUnavailable

        assert self.funds is not None
        try:
            self.status = await self.funds.status()
        except FundsUnavailable as error:
            self.error = str(error)
        else:
            self.error = ""
        self.draw()

    def draw(self) -> None:
        status = self.status
        lines = [self.error] if self.error else []
        if status is not None:
            if not status.pools:
                lines.append("mining pools: this wallet has deposited in none")
            lines += status.notes
        if self.last_claim:
            lines.append(self.last_claim)
        self.notes.update("\n".join(lines))
        self.notes.display = bool(lines)
        rows = [] if status is None else status.stakes()
        cursor = self.table.cursor_row
        self.table.clear()
        for stake in rows:
            self.table.add_row(*stake_cells(stake), key=stake.key)
        self.rows = rows
        if rows:
            self.table.move_cursor(row=min(cursor, len(rows) - 1))
        self.table.display = bool(rows)

    def selected(self) -> Stake | None:
        if not self.rows:
            return None
        return self.rows[min(max(self.table.cursor_row, 0), len(self.rows) - 1)]

    @on(DataTable.RowSelected, "#funds-table")
    def _row_selected(self) -> None:
        self.ask_claim()

    def ask_claim(self) -> None:
        """The confirmation for the highlighted row; its amount is computed here, once."""
        stake = self.selected()
        if self.funds is None or stake is None:
            self.notify("no mining pool or airdrop of this wallet to claim from",
                        severity="warning")
            return
        amount = stake.claimable
        if amount <= 0:
            self.notify(f"nothing to claim from {stake_cells(stake)[0]}: {stake.why_nothing}",
                        severity="warning")
            return
        question = claim_question(stake, amount, str(self.funds.wallet.pubkey()))

        def answered(confirmed: bool | None) -> None:
            if confirmed:
                self.notify("claiming… (the transaction is on its way)")
                self._send_claim(stake, amount)

        self.app.push_screen(FundsClaimScreen(question, stake, amount), answered)

    @work(exclusive=True, group="funds-claim")
    async def _send_claim(self, stake: Stake, amount: int) -> None:
        from run_manager.funds import FundsUnavailable

        assert self.funds is not None  # only after the dialog, which needs it
        what = stake_cells(stake)[0]
        try:
            held = await self.funds.claim(stake, amount)
        except FundsUnavailable as error:
            self.last_claim = f"claim failed: {error}"
            self.notify(str(error), title="claim failed", severity="error", timeout=30)
        else:
            self.last_claim = (f"claimed {amount} base units from {what}: token balance now "
                               f"{held} base units")
            self.notify(self.last_claim, title="claimed", timeout=30)
            self.post_message(FundsClaimed(self.last_claim))
        await self.read()
