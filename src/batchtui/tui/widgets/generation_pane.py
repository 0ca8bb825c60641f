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

from ...core.endpoint.result import EndpointComparison
from ...core.numbers.generation_result import GenerationComparison
from ...core.visible import literal
from .. import chart_colors
from ..views.generation_screen import GenerationScreen, RunText, TextRow
from ..views.generation_screen import local_generation_screen as local_screen
from ..views.served import endpoint_screen
from ..views.ticks import decade_ticks
from .ladder_chart import LadderChart
from .topk_table import runs_topk_table


class GenerationPane(Vertical):
    DEFAULT_CSS = """
    GenerationPane {
        overflow-y: auto;  /* what a small screen cannot hold, reached by scrolling */
    }

    #gen-state {
        height: auto;
        color: $text-muted;
    }

    #gen-verdict {
        height: auto;
    }

    #gen-table {
        height: auto;
        max-height: 9;
    }

    #gen-continuations {
        height: auto;
        max-height: 10;
    }

    #gen-single, #gen-batched {
        width: 1fr;
        padding: 0 1 0 0;
    }

    #gen-chart {
        height: 1fr;
        min-height: 6;
    }

    #gen-topk, #gen-chart-legend, #gen-checks {
        height: auto;
    }

    #gen-ladder {
        height: 1fr;
        min-height: 8;
    }
    """

    class TextChosen(Message):
        def __init__(self, text: int) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "generation"
        self._shown: tuple[GenerationComparison | EndpointComparison, int] | None = None
        self._screen: GenerationScreen | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="gen-state")
        yield DataTable(id="gen-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="gen-checks")  # (the selected text's, under the table: in view on a 24-line screen)
        yield Static("", id="gen-verdict")  # (all texts', wrapped whole: a border title was cut at 80 columns)
        with Horizontal(id="gen-continuations"):
            yield from (Static(id=f"gen-{run}") for run in ("single", "batched"))
        yield PlotextPlot(id="gen-chart")
        yield from (Static(id=name) for name in ("gen-chart-legend", "gen-topk"))
        yield LadderChart(id="gen-ladder")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("#", "split", "batched →", "single →")

    def waiting(self, state: str) -> None:
        """What runs (or failed) while no generation of the texts on screen is there to show."""
        line = self.query_one("#gen-state", Static)
        line.update(Text(literal(state)))
        line.display = bool(state)
        if state:  # (the verdict of continuations no longer on screen goes with them)
            self.query_one("#gen-verdict", Static).update("")

    def show(self, result: GenerationComparison | EndpointComparison, text: int) -> None:
        if self._shown is None or self._shown[0] is not result:
            self._screen = endpoint_screen(result) if isinstance(result, EndpointComparison) else local_screen(result)
            table = self.query_one(DataTable)
            columns = ("#", "split", *(f"{name} →" for name in self._screen.headers))
            with self.prevent(DataTable.RowHighlighted):  # refilled, its cursor at row 0: no text was chosen
                table.clear(columns=[str(c.label) for c in table.columns.values()] != list(columns))
                if not table.columns:
                    table.add_columns(*columns)
                for row in self._screen.rows:
                    table.add_row(str(row.line), row.split_cell, *(literal(word, 12) for word in row.words))
        self._shown = (result, text)
        screen = self._screen
        self.query_one("#gen-verdict", Static).update(Text(literal(screen.verdict)))
        self.waiting("")
        table = self.query_one(DataTable)
        if table.cursor_row != text:
            with self.prevent(DataTable.RowHighlighted):
                table.move_cursor(row=text)
        row = screen.rows[text]
        for widget, run in zip(self.query("#gen-continuations Static").results(Static), row.runs):
            widget.update(self._continuation(run))
        self._chart(row, screen.curve_labels)
        checks = self.query_one("#gen-checks", Static)
        checks.update(Text(literal(row.checks)))
        checks.display = bool(row.checks)
        self.query_one(LadderChart).show(screen.ladder)
        topk = self.query_one("#gen-topk", Static)
        if row.split_top is None:
            topk.update(Text(row.about))
        else:
            warning = self.app.theme_variables.get("warning", "yellow")
            width = self.content_size.width
            topk.update(runs_topk_table(*row.split_top, width, warning, screen.headers, screen.value_name))

    @staticmethod
    def _continuation(run: RunText) -> Text:
        """The shared prefix dim, the first differing piece reversed in red, what follows plain."""
        shown = Text()
        shown.append(f"{run.title}\n", style="bold")
        styles = {"shared": "dim", "split": "bold reverse red", "after": ""}
        for piece in run.pieces:
            shown.append(literal(piece.token), style=styles[piece.state])
        return shown

    def _chart(self, row: TextRow, labels: tuple[str, str]) -> None:
        chart = self.query_one(PlotextPlot)
        chart.display = row.curve is not None
        legend = self.query_one("#gen-chart-legend", Static)
        if row.curve is None:
            legend.update("")
            return
        plt = chart.plt
        plt.clear_figure()
        curve = row.curve
        values = [v for v in (*curve.log10_max_abs_diff, *curve.log10_margin) if v is not None]
        decades, ticks = decade_ticks(values)
        floor = (decades[0] if decades else 0) - 1
        for series, color in (
            (curve.log10_max_abs_diff, chart_colors.BATCHED),
            (curve.log10_margin, chart_colors.SINGLE),
        ):
            plt.plot(list(curve.steps), [floor if v is None else v for v in series], marker="hd", color=color)
        plt.yticks([floor, *decades], ["0", *ticks])
        plt.xticks(list(curve.steps))
        chart.refresh()
        legend.update(
            Text.assemble(
                ("━━", chart_colors.rich(chart_colors.BATCHED)),
                f" {labels[0]}  ",
                ("━━", chart_colors.rich(chart_colors.SINGLE)),
                f" {labels[1]} · log10, {row.upto}",
            )
        )

    @on(DataTable.RowHighlighted, "#gen-table")
    def _row(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.has_focus:
            self.post_message(self.TextChosen(event.cursor_row))

    @property
    def table(self) -> DataTable:
        return self.query_one(DataTable)

    def focus_table(self) -> None:
        self.table.focus()
