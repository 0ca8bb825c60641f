"""Sweep: dtype x batch size on the current texts; max|Δ| against batch size per dtype."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, ProgressBar, Static
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from ..core.plain_text import sweep_row
from ..core.settings import Settings
from ..core.views import decade_ticks, log2_positions, sweep_series
from .engine_calls import call_engine

SWEEP_DTYPES = ("bfloat16", "float16", "float32")
SWEEP_BATCH_SIZES = (1, 2, 4, 8, 16)
DTYPE_COLORS = {"bfloat16": "orange", "float16": "magenta", "float32": "cyan", "float64": "green"}


class SweepScreen(Screen[None]):
    BINDINGS = [Binding("escape", "dismiss", "Back")]

    def __init__(self, texts: list[str], settings: Settings, finished=None, on_finished=None) -> None:
        super().__init__()
        self.texts = texts
        self.settings = settings
        self.cells = None
        self._finished = finished  # a sweep of these texts and settings measured before: shown as it is
        self._on_finished = on_finished  # called with the cells once a sweep completes

    def compose(self) -> ComposeResult:
        s = self.settings
        yield Static(
            f"Sweep of dtype x batch size · attn {s.attn or 'default'} · {s.padding_side} padding · "
            f"{s.positions} positions · {len(self.texts)} texts",
            id="title",
        )
        yield ProgressBar(id="sweep-progress", show_eta=False)
        yield PlotextPlot(id="sweep-chart")
        yield DataTable(id="sweep-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(
            "dtype", "batch", "attn", "padding", "diverged", "max|Δ|", "flips", "error"
        )
        if self._finished is not None:
            self._show(self._finished)
        elif self.texts:
            self._run()
        else:
            self.notify("no texts to compare", severity="warning", markup=False)

    @work(thread=True, exclusive=True)
    def _run(self) -> None:
        worker = get_current_worker()
        from ..core.engine import compare
        from ..core.sweep import sweep, sweep_grid

        grid = sweep_grid(
            self.settings,
            SWEEP_DTYPES,
            SWEEP_BATCH_SIZES,
            [self.settings.attn or "default"],
            [self.settings.padding_side],
        )
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
            self._on_finished(cells)
        self.query_one(ProgressBar).update(total=1, progress=1)
        table = self.query_one(DataTable)
        for c in cells:
            table.add_row(*(Text(cell) for cell in sweep_row(c)))
        chart = self.query_one(PlotextPlot)
        plt = chart.plt
        plt.clear_figure()
        series = sweep_series(cells)
        all_values = [v for _, values in series.values() for v in values]
        ticks, labels = decade_ticks(all_values)
        floor = (ticks[0] if ticks else 0) - 1
        for dtype, (batch_sizes, values) in series.items():
            ys = [floor if v is None else v for v in values]
            xs = log2_positions(batch_sizes)
            plt.plot(xs, ys, marker="hd", color=DTYPE_COLORS.get(dtype, "white"), label=dtype)
        plt.xticks(log2_positions(SWEEP_BATCH_SIZES), [str(b) for b in SWEEP_BATCH_SIZES])
        plt.yticks([floor, *ticks], ["0", *labels])
        plt.xlabel("batch size (log2 axis)")
        plt.title("max|Δ| against batch size, per dtype (0 = bitwise equal)")
        chart.refresh()
