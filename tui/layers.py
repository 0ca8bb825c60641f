"""Where divergence starts and how it grows: per-layer max|Δ| of the selected text."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from ..core.comparison import Comparison
from ..core.views import decade_ticks, layer_curve


class LayersPane(PlotextPlot):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "layers"
        self._shown: tuple | None = None

    def show(self, comparison: Comparison | None, text: int, per_module: bool = False) -> None:
        shown = self._shown
        if shown is not None and shown[0] is comparison and shown[1:] == (text, per_module):
            return  # moving along a text's positions leaves its layer curve as it is
        self._shown = (comparison, text, per_module)
        plt = self.plt
        plt.clear_figure()
        if comparison is None or not comparison.texts or not comparison.texts[text].layers:
            self.refresh()
            return
        curve = layer_curve(comparison.texts[text], per_module)
        xs = list(range(len(curve.names)))
        diverged = [(x, y) for x, y in zip(xs, curve.log10_max_abs_diff) if y is not None]
        equal = [x for x, y in zip(xs, curve.log10_max_abs_diff) if y is None]
        ticks, tick_labels = decade_ticks(curve.log10_max_abs_diff)
        floor = (ticks[0] if ticks else 0) - 1
        if diverged:
            plt.plot([x for x, _ in diverged], [y for _, y in diverged], marker="hd", color="orange")
        if equal:
            plt.scatter(equal, [floor] * len(equal), marker="=", color="green")
        plt.xticks(list(curve.tick_indices), [curve.tick_labels[i] for i in curve.tick_indices])
        plt.yticks([floor, *ticks], ["=", *tick_labels])
        start = f"diverges from {curve.first_divergent}" if curve.first_divergent else "all bitwise equal"
        view = "modules" if per_module and comparison.texts[text].modules else "layers"
        self.border_title = f"{view} · text {comparison.texts[text].line} · {start}"
        self.border_subtitle = f"log10 max|Δ| per {view[:-1]} · = bitwise equal · m: layers/modules"
        self.refresh()
