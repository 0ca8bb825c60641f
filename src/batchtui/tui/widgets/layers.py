"""Where divergence starts and how it grows: per-layer max|Δ| of the selected text, with a legend line
under the chart (inside the pane: short screens draw no bottom border) that names the first divergent
layer or module in full."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static
from textual_plotext import PlotextPlot

from ...core.numbers.comparison import Comparison
from ...core.visible import literal
from ..views.layers import MARK_LEGEND, fitted_labels, layer_curve
from ..views.ticks import decade_ticks
from .chart_pane import ChartPane


class LayersPane(ChartPane):
    DEFAULT_CSS = """
    #layers-chart {
        height: 1fr;
    }

    #layers-legend {
        height: auto;
        color: $text-muted;
    }
    """

    PANE_TITLE = "layers"

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="layers-chart")
        yield Static(id="layers-legend")

    def show(self, comparison: Comparison | None, text: int, modules: bool = False) -> None:
        shown = self._shown
        if shown is not None and shown[0] is comparison and shown[1:] == (text, modules):
            return  # moving along a text's positions leaves its layer curve as it is
        self._shown = (comparison, text, modules)
        self._draw()

    def _draw(self) -> None:
        comparison, text, modules = self._shown
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        if comparison is None or not comparison.texts or not comparison.texts[text].layers:
            self._caption("layers-legend", "")
            chart.refresh()
            return
        curve = layer_curve(comparison.texts[text], modules)
        xs = list(range(len(curve.names)))
        diverged = [(x, y) for x, y in zip(xs, curve.log10_max_abs_diff) if y is not None]
        equal = [x for x, y in zip(xs, curve.log10_max_abs_diff) if y is None]
        decades, decade_labels = decade_ticks(curve.log10_max_abs_diff)
        floor = (decades[0] if decades else 0) - 1
        modules = modules and bool(comparison.texts[text].modules)
        if diverged:
            xs_d, ys_d = [x for x, _ in diverged], [y for _, y in diverged]
            plt.plot(xs_d, ys_d, marker="hd", color="gray" if modules else "orange")
            if modules:  # each module drawn as its letter: what every point is
                for mark in dict.fromkeys(curve.marks[x] for x in xs_d):
                    points = [(x, y) for x, y in diverged if curve.marks[x] == mark]
                    plt.scatter([x for x, _ in points], [y for _, y in points], marker=mark, color="orange")
        if equal:
            plt.scatter(equal, [floor] * len(equal), marker="=", color="green")
        ticks = list(curve.tick_indices)
        width = max(chart.size.width - 6, 2)  # less the y labels and the frame
        plt.xticks(ticks, fitted_labels(ticks, [curve.tick_labels[i] for i in ticks], len(curve.names), width))
        plt.yticks([floor, *decades], ["=", *decade_labels])
        view = "modules" if modules else "layers"
        self.border_title = f"{view} · text {comparison.texts[text].line}"
        start = f"diverges from {literal(curve.first_divergent)}" if curve.first_divergent else "all bitwise equal"
        marks = MARK_LEGEND if modules else "log10 max|Δ| per layer"
        # No-break spaces inside an item: a narrow pane wraps the legend between items, never inside one.
        items = [start, *marks.split(" · "), "= bitwise equal", "m: layers/modules"]
        self._caption("layers-legend", Text(" · ".join(item.replace(" ", "\u00a0") for item in items)))
        chart.refresh()

    @property
    def legend(self) -> str:
        return str(self.query_one("#layers-legend", Static).render()).replace("\u00a0", " ")
