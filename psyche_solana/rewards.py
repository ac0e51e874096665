"""A wallet's rewards in a run, read from the chain: what `wallet balance -r` prints and
the run-manager's Wallet panel shows.

    status = await reward_status(rpc, await find_run(rpc, run_id), wallet_pubkey)
    status.earned, status.claimed, status.claimable     # points (1 point = 1 base unit)
    status.mint, status.held, format_units(status.held, status.decimals)

Points earned are the coordinator's reward entries; points claimed are the treasurer
participant account's; the token balance is the wallet's associated token account of
the run's collateral mint (0 while it does not exist). A run without a treasurer has
points but no reward token (`mint` None).
"""

from __future__ import annotations

from dataclasses import dataclass

from solders.pubkey import Pubkey

from psyche_solana import instructions as ix
from psyche_solana.rpc import SolanaRpc
from psyche_solana.runs import RunHandle, claimable, mint_decimals


@dataclass(frozen=True)
class RewardStatus:
    earned: int
    """Points the coordinator credits this wallet with."""
    claimed: int
    """Points already paid out by the treasurer."""
    mint: Pubkey | None = None
    """The run's reward token; None when the run has no treasurer."""
    decimals: int = 0
    held: int = 0
    """The wallet's balance of the reward token, in base units."""

    @property
    def claimable(self) -> int:
        return self.earned - self.claimed


async def reward_status(rpc: SolanaRpc, run: RunHandle, user: Pubkey) -> RewardStatus:
    earned, claimed = await claimable(rpc, run, user)
    if run.treasurer is None:
        return RewardStatus(earned, claimed)
    mint = run.treasurer.collateral_mint
    decimals = await mint_decimals(rpc, mint)
    data = await rpc.account_data(ix.associated_token_address(user, mint))
    return RewardStatus(earned, claimed, mint, decimals, ix.token_amount(data) if data else 0)


def format_units(amount: int, decimals: int) -> str:
    """Base units as token units without trailing zeros: 50250000 with 6 decimals -> 50.25."""
    text = f"{amount / 10**decimals:.{decimals}f}" if decimals else str(amount)
    return text.rstrip("0").rstrip(".") if "." in text else text
