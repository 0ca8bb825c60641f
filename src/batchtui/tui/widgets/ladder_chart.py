"""A served run's concurrency ladder as bars: per level, the texts that split and those that keep their tokens
with logprobs moved; hidden for a local generation or a single level."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from .. import chart_colors
from ..views.generation_screen import LadderView


class LadderChart(Vertical):
    DEFAULT_CSS = """
    #ladder-plot {
        height: 1fr;
    }

    #ladder-caption {
        height: auto;
    }
    """

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="ladder-plot")
        yield Static("", id="ladder-caption")

    def show(self, ladder: LadderView | None) -> None:
        self.display = ladder is not None
        if ladder is None:
            return
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        labels = [str(c) for c in ladder.concurrency]
        plt.multiple_bar(
            labels,
            [list(ladder.split), list(ladder.logprobs_differ)],
            color=[chart_colors.BATCHED, chart_colors.SINGLE],
        )
        top = max((*ladder.split, *ladder.logprobs_differ, 1))
        plt.yticks(list(range(top + 1)) if top <= 8 else None)
        plt.xlabel("requests in flight")
        chart.refresh()
        self.query_one("#ladder-caption", Static).update(
            Text.assemble(
                ("██", chart_colors.rich(chart_colors.BATCHED)),
                " texts split  ",
                ("██", chart_colors.rich(chart_colors.SINGLE)),
                f" same tokens, logprobs moved · {ladder.caption}",
            )
        )
