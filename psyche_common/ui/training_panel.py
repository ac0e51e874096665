"""Training: the loss plot, tokens/s, the sizes of the last results, why the client was
taken out of an epoch, and the run's end once it has finished."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from psyche_common.ui.view import RunView, describe_training


class TrainingPanel(Vertical):
    BORDER_TITLE = "Training"

    def compose(self) -> ComposeResult:
        self.plot = PlotextPlot(id="training-loss")
        self.summary = Static(id="training-summary")
        yield self.plot
        yield self.summary

    def on_mount(self) -> None:
        self.summary.update("\n".join(describe_training(None)))
        self._draw([])

    def show(self, dashboard: RunView) -> None:
        self.summary.update("\n".join(describe_training(
            dashboard.metrics, dashboard.metrics_error, dashboard.run)))
        self._draw(list(dashboard.losses))

    def _draw(self, losses: list[tuple[int, float]]) -> None:
        plt = self.plot.plt
        plt.clear_data()
        plt.title("loss")
        plt.xlabel("step")
        if losses:
            steps, values = zip(*losses, strict=True)
            plt.plot(list(steps), list(values), marker="braille")
        self.plot.refresh()
