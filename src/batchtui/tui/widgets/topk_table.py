"""Both runs' top-k at one position (or generation step) side by side, as the detail and the generation
view show it: tokens whose rank moved highlighted, with their rank in the other run. Tokens get the width
the pane has, logits the digits that tell them apart."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ...core.numbers.comparison import PositionMetrics, TopToken
from ...core.terminal.plain import decimals_to_tell_apart
from ...core.visible import shown_token

# Content width below which the table takes its compact form (rank marks without parentheses).
NARROW_PANE = 50
# A token cell's width: at least MIN_TOKEN columns, at most MAX_TOKEN (a whole word, not a paragraph).
MIN_TOKEN, MAX_TOKEN = 5, 24


def topk_table(p: PositionMetrics, width: int, highlight: str) -> Table:
    return runs_topk_table(p.topk_batch, p.topk_single, width, highlight)


def runs_topk_table(
    first: tuple[TopToken, ...],
    second: tuple[TopToken, ...],
    width: int,
    highlight: str,
    names: tuple[str, str] = ("batched", "single"),
    value: str = "logit",
) -> Table:
    """Two runs' top-k side by side (`names` and the numbers' `value` name head the columns)."""
    narrow = width < NARROW_PANE
    tokens = (*first, *second)
    decimals = decimals_to_tell_apart([t.logit for t in tokens], least=2 if narrow else 3)
    logit_width = max(len(f"{t.logit:.{decimals}f}") for t in tokens) if tokens else 5
    rank_mark = 3 if narrow else 6  # " 12" or " (12)"
    # What the rank, the two logit columns and the gaps leave, shared by the two token columns.
    room = (width - len(str(len(first))) - 2 * logit_width - 4) // 2 - rank_mark
    token_width = min(max(room, MIN_TOKEN), MAX_TOKEN)
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
    for header in ("#", names[0], value, names[1], value):
        table.add_column(header, justify="right" if header in ("#", value) else "left", no_wrap=True)
    for rank, (b, s) in enumerate(zip(first, second)):
        cells = (_cells(t, rank, narrow, highlight, token_width, decimals) for t in (b, s))
        table.add_row(str(rank + 1), *(cell for pair in cells for cell in pair))
    return table


def _cells(token: TopToken, rank: int, narrow: bool, highlight: str, width: int, decimals: int) -> tuple[Text, Text]:
    # A token whose rank differs in the other run (or that is absent there) is highlighted.
    moved = token.rank_in_other != rank
    style = f"bold {highlight}" if moved else ""
    shown = Text(shown_token(token.token, width), style=style)
    if moved:
        other = "+" if token.rank_in_other is None else str(token.rank_in_other + 1)
        shown.append(f" {other}" if narrow else (" new" if other == "+" else f" ({other})"), style=style)
    return shown, Text(f"{token.logit:.{decimals}f}", style=style)
