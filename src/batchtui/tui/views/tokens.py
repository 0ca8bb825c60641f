"""A position's tokens, ready to draw: the top-k of both runs side by side, and the strip of tokens around it."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.models.token_text import readable_pieces
from ...core.numbers.comparison import PositionMetrics, TextResult
from .heatmap_cells import bucket_of


@dataclass(frozen=True)
class TopkRow:
    """One token of the union of both runs' top-k at a position, with its probability in each run."""

    token: str
    p_single: float
    p_batched: float
    rank_single: int | None  # 0-based rank in the single run's top-k, None if not there
    rank_batched: int | None


def topk_union(position: PositionMetrics) -> list[TopkRow]:
    """Every token either run ranks in its top-k, with its probability in both runs, most probable (in
    either run) first; ties keep the single run's order, then the batched run's."""
    rows = [
        TopkRow(t.token, t.prob, t.prob_in_other, rank, t.rank_in_other) for rank, t in enumerate(position.topk_single)
    ]
    rows += [
        TopkRow(t.token, t.prob_in_other, t.prob, None, rank)
        for rank, t in enumerate(position.topk_batch)
        if t.rank_in_other is None
    ]
    return sorted(rows, key=lambda row: -max(row.p_single, row.p_batched))


@dataclass(frozen=True)
class StripToken:
    position: int
    token: str
    bucket: int  # the heatmap's colour bucket of the position's max|Δ|
    flip: bool
    label: str  # what the strip shows: the token, or for byte pieces the character they spell (or `·`)


def token_strip(text: TextResult, position: int, width: int, shown=len) -> list[StripToken]:
    """The text's tokens around `position` that fit `width` columns, the selected one as near the middle
    as the text's ends allow. `shown(label)` is a token label's width on screen (one space between)."""
    columns = text.columns
    count = len(columns.token_ids)
    if count == 0:
        return []
    position = min(max(position, 0), count - 1)
    labels = readable_pieces(text.tokens)

    def cost(index: int) -> int:
        return shown(labels[index]) + 1

    first = last = position
    used = cost(position)
    grew = True
    while grew:  # add a token on each side in turn until neither fits
        grew = False
        for step in (-1, 1):
            index = first - 1 if step < 0 else last + 1
            if 0 <= index < count and used + cost(index) <= width:
                used += cost(index)
                first, last = min(first, index), max(last, index)
                grew = True
    return [
        StripToken(i, text.tokens[i], bucket_of(columns.max_abs_diff[i]), columns.top1_flip[i], labels[i])
        for i in range(first, last + 1)
    ]
