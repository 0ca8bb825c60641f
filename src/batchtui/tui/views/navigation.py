"""Moving over a comparison's cells: the next divergence or flip, the worst flip, the summary's orders, and the
outcome in words."""

from __future__ import annotations

from ...core.numbers.comparison import Comparison
from ...core.terminal.plain import counted, invariant_tally, invariant_verdict, verdict_rule
from .heatmap_cells import divergent_cells


def describe_outcome(comparison: Comparison, batch_size: int) -> list[str]:
    """The status line's account of a run, most important first: how many texts diverge and flip, the
    invariant mode's verdict, the batch size actually used when there are fewer texts than it, and what
    usually reveals a divergence when none showed."""
    summary = comparison.summary
    judged = "bitwise" if verdict_rule(comparison.config) == "bitwise equal" else "allclose"  # (atol, rtol: the panel)
    parts = [f"{summary.diverged}/{summary.texts} texts diverge ({judged}) · {counted(summary.top1_flips, 'flip')}"]
    if comparison.config.get("invariant"):  # in the headline, which the line always shows; the details after
        parts[0] += f" · invariant mode: {invariant_tally(comparison)}"
        parts.append(f"invariant mode: {invariant_verdict(comparison)}")
    if batch_size > summary.texts:
        parts.append(f"effective batch size {summary.texts} (of {batch_size}: {summary.texts} texts)")
    if summary.diverged == 0 and summary.top1_flips == 0 and not comparison.config.get("invariant"):
        parts.append("no divergence: right padding (p), arange positions (o) or another dtype (d) usually shows one")
    return parts


# The summary's orders: the texts' own, then worst first by each measure.
SUMMARY_ORDERS = ("text", "max|Δ|", "flips", "KL")


def summary_order(comparison: Comparison, order: str) -> list[int]:
    """Text indices in the order the summary lists them: worst first by the order's measure, ties broken
    by the other measures (an allclose text never above a divergent one), then the texts' order."""
    key = {
        "text": lambda t: (),
        "max|Δ|": lambda t: (-t.max_abs_diff, -t.top1_flips, t.allclose, -t.kl_max),
        "flips": lambda t: (-t.top1_flips, t.allclose, -t.max_abs_diff, -t.kl_max),
        "KL": lambda t: (-t.kl_max, t.allclose, -t.max_abs_diff, -t.top1_flips),
    }[order]
    return [t.index for t in sorted(comparison.texts, key=lambda t: (*key(t), t.index))]


def flip_cells(comparison: Comparison) -> list[tuple[int, int]]:
    """(text, position) of every top-1 flip, reading order."""
    return [(t.index, i) for t in comparison.texts for i, flip in enumerate(t.columns.top1_flip) if flip]


def next_flip(comparison: Comparison, text: int, position: int, forward: bool = True) -> tuple[int, int] | None:
    """The next (or previous) top-1 flip after (text, position), across texts, wrapping; None if none."""
    return _next_in(flip_cells(comparison), (text, position), forward)


def worst_flip(comparison: Comparison) -> tuple[int, int] | None:
    """The top-1 flip with the largest max|Δ| over all texts (first in reading order on a tie); with no
    flip, the divergent position with the largest max|Δ|; None when nothing diverges."""
    cells = flip_cells(comparison) or divergent_cells(comparison)
    if not cells:
        return None
    return max(cells, key=lambda cell: (comparison.texts[cell[0]].columns.max_abs_diff[cell[1]], -cell[0], -cell[1]))


def _next_in(cells: list[tuple[int, int]], here: tuple[int, int], forward: bool) -> tuple[int, int] | None:
    if not cells:
        return None
    if forward:
        return next((cell for cell in cells if cell > here), cells[0])
    return next((cell for cell in reversed(cells) if cell < here), cells[-1])


def next_divergent(comparison: Comparison, text: int, position: int, forward: bool = True) -> tuple[int, int] | None:
    """The next (or previous) divergent cell after (text, position), wrapping around; None if none."""
    return _next_in(divergent_cells(comparison), (text, position), forward)


def clamp_cell(comparison: Comparison, text: int, position: int) -> tuple[int, int]:
    """The nearest existing (text, position): texts have different lengths."""
    if not comparison.texts:
        return 0, 0
    text = min(max(text, 0), len(comparison.texts) - 1)
    length = len(comparison.texts[text].token_ids)
    return text, min(max(position, 0), max(length - 1, 0))
