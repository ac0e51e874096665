"""One widget per panel; each redraws itself from the shared Dashboard."""

from run_manager.tui.widgets.container_panel import ContainerPanel
from run_manager.tui.widgets.run_panel import RunPanel
from run_manager.tui.widgets.training_panel import TrainingPanel
from run_manager.tui.widgets.wallet_panel import WalletPanel
from run_manager.tui.widgets.witness_panel import WitnessPanel

__all__ = ["ContainerPanel", "RunPanel", "TrainingPanel", "WalletPanel", "WitnessPanel"]
