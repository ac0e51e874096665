"""The testnet TUI's widgets, one per file: the loss plot and the log pane."""

from local_testnet.widgets.log_pane import LogPane, LogTail
from local_testnet.widgets.loss_plot import LossPlot, mean_losses

__all__ = ["LogPane", "LogTail", "LossPlot", "mean_losses"]
