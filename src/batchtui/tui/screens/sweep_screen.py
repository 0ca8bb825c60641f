"""Sweep: dtype x batch size on the current texts; max|Δ| against batch size per dtype.

The grid is set on the screen (dtypes and batch sizes, comma-separated) and runs on enter (or ctrl+r),
never on its own; a finished sweep of the same texts and settings comes back as it was."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label, ProgressBar, Static
from textual_plotext import PlotextPlot

from ...core.errors import InputError
from ...core.experiments.sweep import describe_cell, parse_batch_sizes, parse_names, sweep_summary
from ...core.settings import LOW_PRECISION_GRID, Settings
from ...core.terminal.plain import SWEEP_HEADER, sweep_row
from .. import chart_colors
from ..messages import SweepDone, SweepProgress
from ..views.ticks import decade_ticks, log2_positions, sweep_series, thinned
from ..widgets.steady_footer import SteadyFooter

SWEEP_DTYPES = LOW_PRECISION_GRID
SWEEP_BATCH_SIZES = (1, 2, 4, 8, 16)
# Rows of the chart that are not the plot: title, x ticks, x label and the frame.
CHART_FURNITURE = 5


class SweepScreen(Screen[None]):
    CSS = """
    #title {
        padding: 0 1;
        text-style: bold;
    }

    /* The chart gets the rows that keep its decades apart, the table (which scrolls) the rest. */
    #sweep-chart {
        height: 2fr;
        min-height: 11;
    }

    #sweep-table {
        height: 1fr;
        min-height: 4;
    }

    #sweep-grid {
        height: 1;
        padding: 0 1;
    }

    #sweep-grid Label {
        padding: 0 1;
        color: $text-muted;
    }

    #sweep-grid Input {
        width: 1fr;
    }

    #sweep-state {
        height: auto;
        padding: 0 1;
    }

    #sweep-progress {
        width: auto;
        padding: 0 1 0 0;
    }

    #sweep-status {
        width: 1fr;
        height: auto;
    }

    #sweep-legend {
        height: 1;
        padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape", "dismiss", "Back"), Binding("ctrl+r", "run", "Run the grid")]

    def __init__(self, texts: list[str], settings: Settings, finished=None, on_finished=None) -> None:
        super().__init__()
        self.texts = texts
        self.settings = settings
        self.cells = None
        # A sweep of these texts and settings measured before, (dtypes, batch sizes, cells): shown as it is.
        self.grid = finished[:2] if finished else (SWEEP_DTYPES, SWEEP_BATCH_SIZES)
        self._finished = finished[2] if finished else None
        self._on_finished = on_finished  # called with (dtypes, batch sizes, cells) once a sweep completes

    def compose(self) -> ComposeResult:
        yield Static(self._title(self.settings.attn or "default"), id="title", markup=False)
        with Horizontal(id="sweep-grid"):
            yield Label("dtypes")
            yield Input(",".join(self.grid[0]), id="sweep-dtypes", compact=True)
            yield Label("batch sizes")
            yield Input(",".join(map(str, self.grid[1])), id="sweep-batch-sizes", compact=True)
        with Horizontal(id="sweep-state"):
            yield ProgressBar(id="sweep-progress", show_eta=True)
            yield Static("enter (or ctrl+r) runs the grid · tab: next field · esc: back", id="sweep-status")
        yield PlotextPlot(id="sweep-chart")
        yield Static(id="sweep-legend")
        yield DataTable(id="sweep-table", cursor_type="row")
        yield SteadyFooter()

    def _title(self, attn: str) -> str:
        s = self.settings
        return f"Sweep · attn {attn} · {s.padding_side} padding · {s.positions} positions · {len(self.texts)} texts"

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*SWEEP_HEADER)
        self.query_one(ProgressBar).display = False
        if self._finished is not None:
            self._show(self._finished)

    @on(Input.Submitted)
    def action_run(self) -> None:
        try:
            dtypes = parse_names(self.query_one("#sweep-dtypes", Input).value)
            batch_sizes = parse_batch_sizes(self.query_one("#sweep-batch-sizes", Input).value)
            for dtype in dtypes:  # an unknown dtype is named before anything runs
                self.settings.with_changes(dtype=dtype).validated()
        except InputError as exc:
            self.notify(str(exc), title="grid not run", severity="error", markup=False)
            return
        if not self.texts:
            self.notify("no texts to compare", severity="warning", markup=False)
            return
        self.grid = (tuple(dtypes), tuple(batch_sizes))
        self._run(self.grid)

    def _run(self, axes: tuple[tuple[str, ...], tuple[int, ...]]) -> None:
        self.app.runs.sweep(self, self.texts, self.settings, axes)

    def on_unmount(self) -> None:
        self.app.runs.cancel("sweep")  # nobody is left to see it

    def on_sweep_progress(self, message: SweepProgress) -> None:
        self._progress(message.done, message.total, message.cell)

    def on_sweep_done(self, message: SweepDone) -> None:
        self._show(message.cells)

    def _progress(self, done: int, total: int, cell) -> None:
        bar = self.query_one(ProgressBar)
        bar.display = True
        bar.update(total=total, progress=done)
        label = f"{done}/{total} done, last {describe_cell(cell)}" if cell is not None else f"running {total} cells…"
        self.query_one("#sweep-status", Static).update(Text(label))

    def _show(self, cells) -> None:
        self.cells = cells
        if self._on_finished is not None:
            self._on_finished((*self.grid, cells))
        self.query_one(ProgressBar).display = False
        self.query_one("#sweep-status", Static).update(Text(sweep_summary(cells), style="bold"))
        attns = sorted({c.attn for c in cells if c.error is None})
        if attns:  # the attention the model resolved, not "default"
            self.query_one("#title", Static).update(self._title(",".join(attns)))
        table = self.query_one(DataTable)
        table.clear()
        for c in cells:
            table.add_row(*(Text(cell) for cell in sweep_row(c)))
        self._chart(cells)

    def on_resize(self) -> None:
        if self.cells is not None:
            self._chart(self.cells)  # how many y ticks fit depends on the height

    def _chart(self, cells) -> None:
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        series = sweep_series(cells)
        all_values = [v for _, values in series.values() for v in values]
        ticks, labels = decade_ticks(all_values)
        floor = (ticks[0] if ticks else 0) - 1
        legend = Text()
        points = []
        for dtype, (batch_sizes, values) in series.items():
            color = chart_colors.DTYPES.get(dtype, chart_colors.OTHER)
            ys = [floor if v is None else v for v in values]
            xs = log2_positions(batch_sizes)
            plt.plot(xs, ys, marker="hd", color=color)
            points.append((xs, ys, chart_colors.dtype_mark(dtype), color))
            legend.append(f"{points[-1][2]}━━ ", style=chart_colors.rich(color))
            legend.append(f"{dtype}   ")
        # Each measured point as its dtype's letter, over every curve: a curve under another still shows.
        for xs, ys, mark, color in points:
            plt.scatter(xs, ys, marker=mark, color=color)
        # The legend is a line of its own under the chart, never drawn over the curves.
        self.query_one("#sweep-legend", Static).update(legend)
        sizes = sorted({c.batch_size for c in cells})
        plt.xticks(log2_positions(sizes), [str(b) for b in sizes])
        # Only as many decades as the plot has rows, evenly spaced: plotext would drop some unevenly.
        rows = max(chart.size.height - CHART_FURNITURE, 2)
        plt.yticks(*thinned([floor, *ticks], ["0", *labels], rows))
        plt.xlabel("batch size (log2 axis)")
        plt.ylabel("max|Δ|")
        plt.title("max|Δ| (log10) against batch size, per dtype (0 = bitwise equal)")
        chart.refresh()
