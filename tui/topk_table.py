"""Both runs' top-k at one position (or generation step) side by side, as the detail and the generation
view show it: tokens whose rank moved highlighted, with their rank in the other run."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..core.comparison import PositionMetrics, TopToken
from ..core.visible import shown_token

# Content width below which the table takes its compact form (shorter tokens and logits).
NARROW_PANE = 50


def topk_table(p: PositionMetrics, width: int, highlight: str) -> Table:
    narrow = width < NARROW_PANE
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
    for header in ("#", "batched", "logit", "single", "logit"):
        table.add_column(header, justify="right" if header in ("#", "logit") else "left", no_wrap=True)
    for rank, (b, s) in enumerate(zip(p.topk_batch, p.topk_single)):
        table.add_row(str(rank + 1), *_cells(b, rank, narrow, highlight), *_cells(s, rank, narrow, highlight))
    return table


def _cells(token: TopToken, rank: int, narrow: bool, highlight: str) -> tuple[Text, Text]:
    # A token whose rank differs in the other run (or that is absent there) is highlighted.
    moved = token.rank_in_other != rank
    style = f"bold {highlight}" if moved else ""
    shown = Text(shown_token(token.token, 5 if narrow else 8), style=style)
    if moved:
        other = "+" if token.rank_in_other is None else str(token.rank_in_other + 1)
        shown.append(f" {other}" if narrow else (" new" if other == "+" else f" ({other})"), style=style)
    return shown, Text(f"{token.logit:.2f}" if narrow else f"{token.logit:.3f}", style=style)
