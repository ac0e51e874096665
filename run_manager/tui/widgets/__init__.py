"""The run-manager's own panels (container, wallet, verification); the run, witness and
training panels are the shared UI kit's (psyche_common.ui). Each redraws itself from the
Dashboard."""

from run_manager.tui.widgets.container_panel import ContainerPanel
from run_manager.tui.widgets.verification_panel import VerificationPanel
from run_manager.tui.widgets.wallet_panel import WalletPanel

__all__ = ["ContainerPanel", "VerificationPanel", "WalletPanel"]
