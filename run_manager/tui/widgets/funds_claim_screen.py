"""The confirmation of a pool or airdrop claim (key a): the exact amount, from where, to
which wallet; Claim or Cancel, as the rewards' ClaimScreen.

`amount` is computed once, when the dialog opens: the question shows it and a Claim sends
it as it is (the chain may have more claimable by then; that stays claimable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from run_manager.tui.widgets.claim_screen import ClaimScreen

if TYPE_CHECKING:  # solders loads only for Solana runs
    from run_manager.funds import Stake


class FundsClaimScreen(ClaimScreen):
    def __init__(self, question: str, stake: Stake, amount: int) -> None:
        super().__init__(question, amount)
        self.stake = stake
        self.amount = amount  # base units of the stake's reward mint
