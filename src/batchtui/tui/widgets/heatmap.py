"""Texts x token positions, coloured by the decade of each position's max|Δ|; moves the selection.

A text longer than the pane is first shown whole, each cell the worst of a span of positions (an
overview); `z` zooms to one position per cell around the selection and back."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Static
from textual_plotext import PlotextPlot

from ...core.numbers.comparison import Comparison
from ..views.heatmap_cells import BUCKET_LEGEND, heatmap_series, overview_span
from ..views.navigation import worst_flip

# 256-colour codes, one per bucket: grey for exactly zero, then cold to hot by decade.
BUCKET_COLORS = (240, 24, 31, 37, 71, 178, 208, 196, 201)
SELECTED_MARKER = "X"
FLIP_MARKER = "▲"  # a top-1 flip, in its bucket's colour
TITLE = "max|Δ| per text (rows) and token position (columns)"
NO_FLIP = "no top-1 flip: every position predicts the same token batched and alone"
NO_DIVERGENT = "no divergent position: every position is allclose with no top-1 flip"


class Heatmap(Vertical, can_focus=True):
    DEFAULT_CSS = """
    Heatmap PlotextPlot {
        height: 8;
    }

    #legend {
        height: auto;
        color: $text-muted;
    }
    """

    # Its keys (arrows, hjkl, Home/End, PgUp/PgDn, z, the jumps) are the explorer screen's: they work from
    # every pane, and come here.
    # Positions a page key moves when the heatmap has not been drawn yet.
    DEFAULT_PAGE = 50

    class Move(Message):
        """The selection moved by `texts` rows and `positions` columns."""

        def __init__(self, texts: int, positions: int) -> None:
            super().__init__()
            self.texts = texts
            self.positions = positions

    class Jump(Message):
        """The selection asked at a cell of its own: (text, position)."""

        def __init__(self, text: int, position: int) -> None:
            super().__init__()
            self.text = text
            self.position = position

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = TITLE
        self._comparison: Comparison | None = None
        self._selected = (0, 0)
        self._window: tuple[int, int] | None = None  # (first position, first text) shown
        self._span = 1  # positions per cell: above 1 in the overview of a text longer than the pane
        self.zoomed = False  # one position per cell even where the longest text does not fit

    def compose(self) -> ComposeResult:
        yield HeatmapPlot()
        yield Static(self._legend(), id="legend")

    @staticmethod
    def _legend() -> Text:
        # No-break spaces inside an item: a narrow pane wraps the legend between items, never inside one.
        legend = Text("log10\u00a0max|Δ| ")
        for label, color in zip(BUCKET_LEGEND, BUCKET_COLORS):
            legend.append("█", style=f"color({color})")
            legend.append(f"\u00a0{label} ")
        legend.append(f"{FLIP_MARKER}\u00a0flip {SELECTED_MARKER}\u00a0selected")
        return legend

    def action_move(self, texts: int, positions: int) -> None:
        # In the overview a step is a cell: the marker moves with every press.
        self.post_message(self.Move(texts, positions * self._span if abs(positions) == 1 else positions))

    def action_page(self, pages: int) -> None:
        """A page is the positions the zoomed heatmap shows at once (the overview's cells, one position each)."""
        columns = self._columns()
        self.post_message(self.Move(0, pages * (columns if columns > 2 else self.DEFAULT_PAGE)))

    def jump(self, finder, forward: bool, none_found: str) -> None:
        """To the next (or previous) cell `finder` gives after the selection, or say there is none."""
        if self._comparison is not None:
            self._jump_to(finder(self._comparison, *self._selected, forward=forward), none_found)

    def jump_to_worst_flip(self) -> None:
        """The flip with the largest max|Δ| in any text (or, with none, the worst divergent position)."""
        if self._comparison is not None:
            self._jump_to(worst_flip(self._comparison), NO_DIVERGENT)

    def _jump_to(self, cell: tuple[int, int] | None, none_found: str) -> None:
        if cell is None:
            self.app.notify(none_found)
        else:
            self.post_message(self.Jump(*cell))

    def action_zoom(self) -> None:
        if not self.zoomed and self._span == 1:
            self.app.notify("every position already has a cell of its own: z zooms texts longer than the heatmap")
            return
        self.zoomed = not self.zoomed
        self._window = None
        self.replot()

    def _label_width(self) -> int:
        """The y labels' width: they are editor lines."""
        texts = self._comparison.texts if self._comparison else ()
        return len(str(max((t.line for t in texts), default=1)))

    def _columns(self) -> int:
        """Canvas cells across: the plot less the y labels and the frame."""
        return max(self.query_one(HeatmapPlot).size.width - self._label_width() - 2, 2)

    def show(self, comparison: Comparison | None, selected: tuple[int, int]) -> None:
        plot = self.query_one(HeatmapPlot)
        if comparison is not None and comparison is not self._comparison:
            # One row per text plus the frame and the x labels; the pane's max-height caps it.
            plot.styles.height = max(len(comparison.texts), 2) + 3
            self._window = None
        self._comparison = comparison
        self._selected = selected
        self.replot()

    def on_resize(self) -> None:
        self._window = None
        self.replot()

    def _fit_window(self, columns: int, rows: int, longest: int) -> tuple[int, int]:
        """The first position and text shown: kept while the selection stays inside, else re-centred.
        The overview always starts at position 0."""
        comparison = self._comparison
        text, position = self._selected
        window = self._window
        span = self._span
        if window is not None:
            first_pos, first_text = window
            if first_pos <= position < first_pos + columns * span and first_text <= text < first_text + rows:
                return window
        first_pos = 0 if span > 1 else min(max(position - columns // 2, 0), max(longest - columns, 0))
        first_text = min(max(text - rows // 2, 0), max(len(comparison.texts) - rows, 0))
        return first_pos, first_text

    def replot(self) -> None:
        plot = self.query_one(HeatmapPlot)
        comparison = self._comparison
        if comparison is None or not comparison.texts:
            plot.plt.clear_figure()
            plot.plt.title("waiting for the first comparison…")
            plot.redraw(marker=None, rebuilt=True)
            return
        text, position = self._selected
        n_texts = len(comparison.texts)
        # One canvas cell per (text, span of positions).
        label_width = self._label_width()
        columns = self._columns()
        rows = max(plot.size.height - 3, 2)
        longest = max(len(t.token_ids) for t in comparison.texts)
        span = 1 if self.zoomed else overview_span(longest, columns)
        if span != self._span:
            self._span, self._window = span, None
        window = self._fit_window(columns, rows, longest)
        first_pos, first_text = window
        last_pos = min(first_pos + columns * span, max(longest, columns)) - 1
        self._name_range(position, first_pos, last_pos, longest, (first_text, min(first_text + rows, n_texts)))
        # The marker is drawn over the rendered figure: the figure is only rebuilt when the window moves.
        marker = (1 + text - first_text, label_width + 1 + (position - first_pos) // span)
        if window == self._window:
            plot.redraw(marker=marker)
            return
        self._window = window
        last_text = first_text + rows - 1
        plt = plot.plt
        plt.clear_figure()
        for series in heatmap_series(comparison, first_pos, last_pos, span):
            cells = [(x, y) for x, y in zip(series.positions, series.texts) if first_text < y <= last_text + 1]
            if cells:
                xs, ys = zip(*cells)
                glyph = FLIP_MARKER if series.flips else "█"
                plt.scatter(list(xs), list(ys), marker=glyph, color=BUCKET_COLORS[series.bucket])
        plt.xlim(first_pos, first_pos + (columns - 1) * span)
        plt.ylim(first_text + 1, last_text + 1)
        plt.yreverse(True)
        shown_texts = range(first_text + 1, min(last_text + 1, n_texts) + 1)
        plt.yticks(list(shown_texts), [str(comparison.texts[row - 1].line) for row in shown_texts])
        step = (10 if columns < 120 else 20) * span
        plt.xticks(list(range(-(-first_pos // step) * step, last_pos + 1, step)))
        plot.redraw(marker=marker, rebuilt=True)

    def _name_range(self, position: int, first: int, last: int, longest: int, texts: tuple[int, int]) -> None:
        """Where the selection is and which positions and texts are in view, when not all of them are:
        under the heatmap, or as its title on a short screen (which draws no bottom border)."""
        line = self._comparison.texts[self._selected[0]].line
        count = len(self._comparison.texts)
        rows_hidden = texts != (0, count)  # rows scrolled away: which are shown, and that ↑ ↓ reach the rest
        if self.screen.has_class("-short"):  # the title, on a pane some 40 columns wide
            parts = [f"text {line} pos {position}"]
            if self._span > 1:
                parts.append(f"{self._span}/cell")
            elif longest > last + 1 or first > 0:
                parts.append(f"{first}–{last}/{longest}")
            if rows_hidden:
                parts.append(f"rows {texts[0] + 1}–{texts[1]}/{count}↕")
            self.border_title, self.border_subtitle = " · ".join(parts), ""
            return
        label, hint = f"text {line} · pos {position}", ""
        if self._span > 1:
            label, hint = f"{label} · all {longest}, {self._span}/cell", " · z zoom"
        elif longest > last + 1 or first > 0:
            label, hint = f"{label} · {first}–{last} of {longest}", " · z all"
        if rows_hidden:
            label += f" · rows {texts[0] + 1}–{texts[1]} of {count} ↑↓"
        self.border_title, self.border_subtitle = TITLE, label + hint


class HeatmapPlot(PlotextPlot):
    """A plotext figure rendered once and reused, with the selection marker drawn over it."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._marker: tuple[int, int] | None = None  # (line, column) in the rendered figure
        self._cache: tuple[tuple, Text] | None = None

    def redraw(self, marker: tuple[int, int] | None, rebuilt: bool = False) -> None:
        self._marker = marker
        if rebuilt:
            self._cache = None
        self.refresh()

    def render(self) -> Text:
        key = (self.size, self.app.theme)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, super().render())
        figure = self._cache[1]
        if self._marker is None:
            return figure
        line, column = self._marker
        lines = figure.split("\n")
        if not (0 <= line < len(lines) and 0 <= column < len(lines[line])):
            return figure
        row = lines[line]
        lines[line] = Text.assemble(row[:column], (SELECTED_MARKER, "bold reverse"), row[column + 1 :])
        return Text("\n").join(lines)
