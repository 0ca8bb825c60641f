"""The heatmap's cells: max|Δ| per position in colour buckets, spans of positions per cell, the cells that diverge."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.numbers.comparison import Comparison

# Heatmap colour scale: bucket 0 is exactly zero, then one bucket per decade of max|Δ|.
_DECADES = tuple(range(-6, 1))  # upper bounds 1e-6 .. 1e0


# Each bucket's legend entry, in log10 units.
BUCKET_LEGEND = ("zero", f"<{_DECADES[0]}", *(str(lo) for lo in _DECADES[:-1]), f">={_DECADES[-1]}")


def bucket_of(max_abs_diff: float) -> int:
    """The heatmap bucket of a position's max|Δ| (log10 decades; 0 and non-finite apart)."""
    if max_abs_diff == 0:
        return 0
    if not math.isfinite(max_abs_diff):
        return len(BUCKET_LEGEND) - 1
    decade = math.floor(math.log10(max_abs_diff))
    return 1 + min(max(decade - _DECADES[0] + 1, 0), len(_DECADES))


@dataclass(frozen=True)
class HeatmapSeries:
    """All cells of one colour bucket, top-1 flips apart: x = a cell's first token position, y = text row
    (1-based)."""

    bucket: int
    positions: tuple[int, ...]
    texts: tuple[int, ...]
    flips: bool = False  # these cells hold a top-1 flip (drawn with their own glyph)


def heatmap_series(comparison: Comparison, first_position: int = 0, last_position: int | None = None, span: int = 1):
    """Cells grouped by bucket and by whether they flip, over positions [first_position, last_position].

    With `span` > 1 a cell stands for `span` consecutive positions from `first_position` (the overview of a
    text longer than the screen): its bucket is the largest max|Δ| among them, and it is a flip cell if any
    of them flips, so no divergence or flip is averaged away."""
    cells: dict[tuple[int, bool], tuple[list[int], list[int]]] = {}
    stop = None if last_position is None else last_position + 1
    for text in comparison.texts:  # from the columns: no per-position objects are built
        diffs = text.columns.max_abs_diff[first_position:stop]
        flips = text.columns.top1_flip[first_position:stop]
        for offset in range(0, len(diffs), span):
            cell = (bucket_of(max(diffs[offset : offset + span])), any(flips[offset : offset + span]))
            xs, ys = cells.setdefault(cell, ([], []))
            xs.append(first_position + offset)
            ys.append(text.index + 1)
    return [HeatmapSeries(bucket, tuple(xs), tuple(ys), flip) for (bucket, flip), (xs, ys) in sorted(cells.items())]


def overview_span(longest: int, columns: int) -> int:
    """Positions per heatmap cell so that a text of `longest` tokens fits `columns` cells (1: it fits)."""
    return max(1, -(-longest // max(columns, 1)))


def divergent_cells(comparison: Comparison) -> list[tuple[int, int]]:
    """(text, position) of every divergent position (not allclose, or a top-1 flip), reading order."""
    return [
        (t.index, index)
        for t in comparison.texts
        for index, (close, flip) in enumerate(zip(t.columns.allclose, t.columns.top1_flip))
        if not close or flip
    ]
