"""The generation view: for every text, whether and where batching changed the greedy continuation; for
the selected text, both continuations side by side, the per-step Δ up to the split, and the split's top-k."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from ..core.chart_ticks import decade_ticks
from ..core.generation_report import generation_verdict, split_words
from ..core.generation_result import GenerationComparison
from ..core.generation_views import continuation_tokens, describe_split, step_curve
from ..core.visible import literal
from . import chart_colors
from .topk_table import topk_table


class GenerationPane(Vertical):
    class TextChosen(Message):
        def __init__(self, text: int) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "generation"
        self._shown: tuple[GenerationComparison, int] | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="gen-state")
        yield DataTable(id="gen-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="gen-continuations"):
            yield from (Static(id=f"gen-{run}") for run in ("single", "batched"))
        yield PlotextPlot(id="gen-chart")
        yield from (Static(id=name) for name in ("gen-chart-legend", "gen-topk"))

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "split", "batched →", "single →")

    def waiting(self, state: str) -> None:
        """What runs (or failed) while no generation of the texts on screen is there to show."""
        line = self.query_one("#gen-state", Static)
        line.update(Text(literal(state)))
        line.display = bool(state)

    def show(self, comparison: GenerationComparison, text: int) -> None:
        table = self.query_one(DataTable)
        if self._shown is None or self._shown[0] is not comparison:
            table.clear()
            for t in comparison.texts:
                batched, single = split_words(t)
                split = "same" if t.split_step is None else f"{t.split_step}{' tie' if t.near_tie else ''}"
                table.add_row(str(t.line), split, literal(batched, 12), literal(single, 12))
        self._shown = (comparison, text)
        self.border_title = f"generation · {generation_verdict(comparison)}"
        self.waiting("")
        if table.cursor_row != text:
            with self.prevent(DataTable.RowHighlighted):
                table.move_cursor(row=text)
        result = comparison.texts[text]
        self.query_one("#gen-single", Static).update(self._continuation(result, "single"))
        self.query_one("#gen-batched", Static).update(self._continuation(result, "batched"))
        self._chart(result)
        split = result.split
        topk = self.query_one("#gen-topk", Static)
        if split is None:
            topk.update(Text(f"text {result.line}: {describe_split(result)}, batched and alone"))
        else:
            warning = self.app.theme_variables.get("warning", "yellow")
            topk.update(topk_table(split, self.content_size.width, warning))

    def _continuation(self, result, run: str) -> Text:
        """The shared prefix dim, the first differing token reversed in red, what follows plain."""
        shown = Text()
        shown.append(f"{run} ({len(getattr(result, run).token_ids)} tokens)\n", style="bold")
        styles = {"shared": "dim", "split": "bold reverse red", "after": ""}
        for token in continuation_tokens(result, run):
            shown.append(literal(token.token), style=styles[token.state])
        return shown

    def _chart(self, result) -> None:
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        curve = step_curve(result)
        values = [v for v in (*curve.log10_max_abs_diff, *curve.log10_margin) if v is not None]
        decades, labels = decade_ticks(values)
        floor = (decades[0] if decades else 0) - 1
        for series, color in (
            (curve.log10_max_abs_diff, chart_colors.BATCHED),
            (curve.log10_margin, chart_colors.SINGLE),
        ):
            plt.plot(list(curve.steps), [floor if v is None else v for v in series], marker="hd", color=color)
        plt.yticks([floor, *decades], ["0", *labels])
        plt.xticks(list(curve.steps))
        chart.refresh()
        upto = f"steps 0–{result.split_step}, up to the split" if result.differs else "every step"
        legend = Text.assemble(
            ("━━", chart_colors.rich(chart_colors.BATCHED)),
            " next-token max|Δ|  ",
            ("━━", chart_colors.rich(chart_colors.SINGLE)),
            f" single run's top-1 margin · log10, {upto}",
        )
        self.query_one("#gen-chart-legend", Static).update(legend)

    @on(DataTable.RowHighlighted, "#gen-table")
    def _row(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.has_focus:
            self.post_message(self.TextChosen(event.cursor_row))

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

    def focus_table(self) -> None:
        self.table.focus()
