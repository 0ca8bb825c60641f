"""Top-k disagreement at the selected position as a chart: every token either run ranks, its probability
single and batched side by side."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from ...core.numbers.comparison import Comparison
from ...core.visible import shown_token
from ..chart_colors import BATCHED, SINGLE, rich
from ..views.ticks import round_ticks
from ..views.tokens import topk_union
from .chart_pane import ChartPane

# Columns of the y axis and frame; a token label gets at least MIN_LABEL columns, at most MAX_LABEL.
AXIS_WIDTH = 8
MIN_LABEL, MAX_LABEL = 5, 10
# Rows of the chart that hold no bars (frame, x labels); at most this many y ticks.
PLOT_FURNITURE, MAX_TICKS = 3, 6


class TopkPane(ChartPane):
    DEFAULT_CSS = """
    #topk-legend {
        height: 1;
        color: $text-muted;
    }

    #topk-values {
        height: auto;
        max-height: 2;
    }
    """

    PANE_TITLE = "top-k"

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="topk-chart")
        legend = Text.assemble(("█", rich(SINGLE)), " single  ", ("█", rich(BATCHED)), " batched · p of each token")
        yield Static(legend, id="topk-legend")
        yield Static(id="topk-values")

    def show(self, comparison: Comparison | None, selected: tuple[int, int]) -> None:
        self._shown = (comparison, selected)
        if self.display:
            self._draw()

    def on_show(self) -> None:
        # Once laid out: how many token labels fit depends on the chart's final width.
        self.call_after_refresh(self._draw)

    def _draw(self) -> None:
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        if self._shown is None or self._shown[0] is None or not self._shown[0].texts:
            chart.refresh()
            return
        comparison, (text, position) = self._shown
        result = comparison.texts[text]
        rows = topk_union(result.position(position))
        # As many tokens as keep their labels readable, most probable first; the title says how many.
        room = max(chart.size.width - AXIS_WIDTH, 1)
        fits = max(1, min(len(rows), room // (MIN_LABEL + 1)))
        shown = rows[:fits]
        label_width = min(MAX_LABEL, room // fits - 1)
        labels = [shown_token(row.token, label_width) for row in shown]
        plt.multiple_bar(
            labels,
            [[row.p_single for row in shown], [row.p_batched for row in shown]],
            color=[SINGLE, BATCHED],
        )
        # Round ticks, as many as the plot has rows for, and the probabilities themselves under the chart.
        top = max(max(row.p_single, row.p_batched) for row in shown)
        ticks = round_ticks(top, min(max(chart.size.height - PLOT_FURNITURE, 2), MAX_TICKS))
        plt.ylim(0, ticks[-1])
        plt.yticks(ticks, [f"{tick:g}" for tick in ticks])
        values = Text("p single/batched: ", style="dim")
        for index, (label, row) in enumerate(zip(labels, shown)):
            values.append(("" if index == 0 else " · ") + f"{label}\u00a0{row.p_single:.3f}/{row.p_batched:.3f}")
        self._caption("topk-values", values)
        which = "" if fits == len(rows) else f" · {fits} most probable of {len(rows)}"
        self.border_title = f"top-k · text {result.line} · position {position}{which}"
        chart.refresh()
