"""The run's loss by step: the mean over the clients that trained it, as the testnet's
summary computes it (first_loss, last_loss)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from textual_plotext import PlotextPlot


def mean_losses(losses_by_client: Iterable[Mapping[int, float]]) -> list[tuple[int, float]]:
    """(step, mean loss of the clients that trained the step), by step."""
    by_step: dict[int, list[float]] = {}
    for losses in losses_by_client:
        for step, loss in losses.items():
            by_step.setdefault(step, []).append(loss)
    return [(step, sum(values) / len(values)) for step, values in sorted(by_step.items())]


class LossPlot(PlotextPlot):
    BORDER_TITLE = "Loss"

    def on_mount(self) -> None:
        self.show([])

    def show(self, points: list[tuple[int, float]]) -> None:
        plt = self.plt
        plt.clear_data()
        plt.xlabel("step")
        if points:
            steps, values = zip(*points, strict=True)
            plt.plot(list(steps), list(values), marker="braille")
            self.border_subtitle = f"step {steps[-1]}: {values[-1]:.3f}"
        self.refresh()
