"""The run-manager's own panels (container, wallet, P2P, verification) and its claim
dialog; the run, witness and training panels are the shared UI kit's (psyche_common.ui).
Each panel redraws itself from the Dashboard."""

from run_manager.tui.widgets.claim_screen import ClaimScreen
from run_manager.tui.widgets.container_panel import ContainerPanel
from run_manager.tui.widgets.p2p_panel import P2PPanel
from run_manager.tui.widgets.verification_panel import VerificationPanel
from run_manager.tui.widgets.wallet_panel import WalletPanel

__all__ = ["ClaimScreen", "ContainerPanel", "P2PPanel", "VerificationPanel", "WalletPanel"]
