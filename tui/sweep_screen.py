"""Sweep: dtype x batch size on the current texts; max|Δ| against batch size per dtype.

The grid is set on the screen (dtypes and batch sizes, comma-separated; enter runs it again)."""

from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label, ProgressBar, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from ..core.errors import InputError
from ..core.plain_text import sweep_row
from ..core.settings import Settings
from ..core.sweep import parse_batch_sizes, parse_names
from ..core.views import decade_ticks, log2_positions, sweep_series
from . import chart_colors
from .engine_calls import call_engine

SWEEP_DTYPES = ("bfloat16", "float16", "float32")
SWEEP_BATCH_SIZES = (1, 2, 4, 8, 16)


class SweepScreen(Screen[None]):
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
        s = self.settings
        yield Static(
            f"Sweep of dtype x batch size · attn {s.attn or 'default'} · {s.padding_side} padding · "
            f"{s.positions} positions · {len(self.texts)} texts",
            id="title",
            markup=False,
        )
        with Horizontal(id="sweep-grid"):
            yield Label("dtypes")
            yield Input(",".join(self.grid[0]), id="sweep-dtypes", compact=True)
            yield Label("batch sizes")
            yield Input(",".join(map(str, self.grid[1])), id="sweep-batch-sizes", compact=True)
            yield Label("enter / ctrl+r: run", id="sweep-hint")
        yield ProgressBar(id="sweep-progress", show_eta=False)
        yield PlotextPlot(id="sweep-chart")
        yield Static(id="sweep-legend")
        yield DataTable(id="sweep-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(
            "dtype", "batch", "attn", "padding", "diverged", "max|Δ|", "flips", "error"
        )
        if self._finished is not None:
            self._show(self._finished)
        else:
            self.action_run()

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

    @work(thread=True, exclusive=True)
    def _run(self, grid_axes: tuple[tuple[str, ...], tuple[int, ...]]) -> None:
        worker = get_current_worker()
        from ..core.engine import compare
        from ..core.sweep import sweep, sweep_grid

        grid = sweep_grid(self.settings, *grid_axes, [self.settings.attn or "default"], [self.settings.padding_side])
        bar = self.query_one(ProgressBar)
        self.app.call_from_thread(bar.update, total=len(grid), progress=0)
        call_engine(
            self.app,
            lambda: sweep(
                self.texts,
                grid,
                compare,
                progress=lambda done, total, _: self.app.call_from_thread(bar.update, progress=done),
                cancelled=lambda: worker.is_cancelled,
            ),
            self._show,
        )

    def _show(self, cells) -> None:
        self.cells = cells
        if self._on_finished is not None:
            self._on_finished((*self.grid, cells))
        self.query_one(ProgressBar).update(total=1, progress=1)
        table = self.query_one(DataTable)
        table.clear()
        for c in cells:
            table.add_row(*(Text(cell) for cell in sweep_row(c)))
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        series = sweep_series(cells)
        all_values = [v for _, values in series.values() for v in values]
        ticks, labels = decade_ticks(all_values)
        floor = (ticks[0] if ticks else 0) - 1
        legend = Text()
        for dtype, (batch_sizes, values) in series.items():
            color = chart_colors.DTYPES.get(dtype, chart_colors.OTHER)
            ys = [floor if v is None else v for v in values]
            plt.plot(log2_positions(batch_sizes), ys, marker="hd", color=color)
            legend.append("━━ ", style=chart_colors.rich(color))
            legend.append(f"{dtype}   ")
        # The legend is a line of its own under the chart, never drawn over the curves.
        self.query_one("#sweep-legend", Static).update(legend)
        sizes = sorted({c.batch_size for c in cells})
        plt.xticks(log2_positions(sizes), [str(b) for b in sizes])
        plt.yticks([floor, *ticks], ["0", *labels])
        plt.xlabel("batch size (log2 axis)")
        plt.title("max|Δ| against batch size, per dtype (0 = bitwise equal)")
        chart.refresh()
