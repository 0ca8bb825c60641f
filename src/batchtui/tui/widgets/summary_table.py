"""One row per text: the per-text numbers of the comparison; selecting a row selects the text."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ...core.numbers.comparison import Comparison
from ...core.terminal.plain import format_float
from ...core.visible import literal
from ..move_keys import POSITION_BINDINGS
from ..views.navigation import summary_order

COLUMNS = ("#", "text", "tok", "max|Δ|", "KL", "flips", "allclose")
# On screens narrower than this the text and token-count columns go (the editor's lines show the
# texts). Columns change only with the table cleared (rebuilding them under rows garbles a DataTable).
NARROW_SCREEN = 100
# The text column takes the width the numbers leave, within these bounds.
MIN_TEXT_WIDTH, MAX_TEXT_WIDTH = 8, 40


class SummaryTable(DataTable):
    # Up and down pick a row (its text); the keys along a text move the selection as on the heatmap.
    BINDINGS = POSITION_BINDINGS

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.border_title = "summary"
        self._columns = COLUMNS
        self._order: list[int] = []  # the text index of each row
        self._shown: tuple[Comparison, int, str] | None = None  # what `show` last drew, to redraw on resize

    @staticmethod
    def _columns_for(width: int) -> tuple[str, ...]:
        return tuple(c for c in COLUMNS if c not in ("text", "tok")) if width < NARROW_SCREEN else COLUMNS

    def on_mount(self) -> None:
        self._columns = self._columns_for(self.app.size.width)
        self.add_columns(*self._columns)

    def on_resize(self) -> None:
        # 120x40 -> 80x24 must not leave flips and allclose past the edge: refit the columns.
        columns = self._columns_for(self.app.size.width)
        if columns != self._columns:
            self._columns = columns
            if self._shown is not None:
                self.show(*self._shown)
            else:
                self.clear(columns=True)
                self.add_columns(*columns)

    def show(self, comparison: Comparison, selected_text: int, order: str = "text") -> None:
        self._shown = (comparison, selected_text, order)
        columns = self._columns
        self._order = summary_order(comparison, order)
        self.border_title = "summary" if order == "text" else f"summary · worst {order} first (s)"
        ok = self.app.theme_variables.get("success", "green")
        bad = self.app.theme_variables.get("error", "red")
        rows = []
        for text in (comparison.texts[i] for i in self._order):
            cells = {
                "#": Text(str(text.line), justify="right"),  # the editor's line number
                "text": Text(literal(text.text)),
                "tok": Text(f"{len(text.token_ids)}{'✂' if text.truncated else ''}", justify="right"),
                "max|Δ|": Text(format_float(text.max_abs_diff), justify="right"),
                "KL": Text(format_float(text.kl_max), justify="right"),
                "flips": Text(str(text.top1_flips), justify="right"),
                "allclose": Text("✓", style=f"bold {ok}") if text.allclose else Text("✗", style=f"bold {bad}"),
            }
            rows.append([cells[c] for c in columns])
        # Columns sized to their content up front: a DataTable that widens a column after drawing some
        # rows keeps those rows drawn at the old width until they are drawn again.
        widths = [max([len(header)] + [row[index].cell_len for row in rows]) for index, header in enumerate(columns)]
        if "text" in columns:  # what the other columns, their padding and a scrollbar leave
            at = columns.index("text")
            room = self.scrollable_content_region.width - 1 - 2 * len(columns) - sum(widths) + widths[at]
            widths[at] = min(max(room, MIN_TEXT_WIDTH), MAX_TEXT_WIDTH, widths[at])
            for row in rows:
                row[at] = Text(literal(row[at].plain, widths[at]))
        self.clear(columns=True)
        for header, width in zip(columns, widths):
            self.add_column(Text(header, justify="left" if header == "text" else "right"), width=width)
        self.add_rows(rows)
        self.select_text(selected_text)

    def text_at(self, row: int) -> int:
        return self._order[row] if 0 <= row < len(self._order) else row

    def select_text(self, index: int) -> None:
        row = self._order.index(index) if index in self._order else index
        if 0 <= row < self.row_count and self.cursor_row != row:
            with self.prevent(DataTable.RowHighlighted):
                self.move_cursor(row=row)
