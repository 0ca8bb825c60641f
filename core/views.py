"""What a view needs from a `Comparison`, ready to draw: colour buckets, curves, navigation.

Torch-free and pure, so the TUI computes no numbers of its own and these are tested directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .comparison import Comparison, LayerMetrics, PositionMetrics, RoutingChange, TextResult
from .plain_text import invariant_verdict
from .token_text import readable_pieces

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


@dataclass(frozen=True)
class LayerCurve:
    """Per-layer (or per-module) divergence of one text as log10(max|Δ|); bitwise-equal ones apart."""

    names: tuple[str, ...]
    log10_max_abs_diff: tuple[float | None, ...]  # None where the module is bitwise equal (or 0)
    rel_l2: tuple[float, ...]
    first_divergent: str | None
    tick_indices: tuple[int, ...]  # where to label the x axis: embeddings, each layer's output, norm
    tick_labels: tuple[str, ...]  # a short label per module: "emb", the layer's number, "norm", "out"
    marks: tuple[str, ...]  # a letter per module saying what it is (MODULE_MARKS), for the per-module view


# The per-module view draws each module as a letter: what each point is, without a name per point.
MODULE_MARKS = {"attention": "a", "MLP": "m", "norm": "n", "router": "r"}
LAYER_MARKS = {"embedding": "e", "layer": "L", "final": "f", "logits": "o"}
OTHER_MARK = "s"  # a sub-module of no known role
MARK_LEGEND = "e emb · a attn · m MLP · n norm · r router · s other · L layer · f final norm · o logits"


def module_mark(module: LayerMetrics) -> str:
    if module.kind == "sub":
        return MODULE_MARKS.get(module.role or "", OTHER_MARK)
    return LAYER_MARKS.get(module.kind, OTHER_MARK)


def short_module_label(module: LayerMetrics) -> str:
    """An x-axis label: the layer's own number for a layer, the last part of the name otherwise."""
    if module.kind == "layer":
        return module.layer.rsplit(".", 1)[-1]
    return {"embedding": "emb", "final": "norm", "logits": "out"}.get(module.kind, module.layer.rsplit(".", 1)[-1])


def layer_curve(text: TextResult, per_module: bool = False) -> LayerCurve:
    metrics = text.modules if per_module and text.modules else text.layers
    first = next((m for m in metrics if not m.bitwise_equal), None)
    return LayerCurve(
        names=tuple(m.layer for m in metrics),
        log10_max_abs_diff=tuple(math.log10(m.max_abs_diff) if m.max_abs_diff > 0 else None for m in metrics),
        rel_l2=tuple(m.rel_l2 for m in metrics),
        first_divergent=first.layer if first else None,
        tick_indices=tuple(i for i, m in enumerate(metrics) if m.kind != "sub"),
        tick_labels=tuple(short_module_label(m) for m in metrics),
        marks=tuple(module_mark(m) for m in metrics),
    )


def fitted_labels(positions: list[int], labels: list[str], points: int, columns: int) -> list[str]:
    """Axis labels at `positions` (of `points` spread evenly over `columns` columns), left to right, each
    blanked where it would touch the label kept before it: every tick stays, as many labels as fit are read."""
    scale = (columns - 1) / max(points - 1, 1)
    kept = []
    free_from = None  # the first column after the last kept label and a space
    for position, label in zip(positions, labels):
        start = round(position * scale) - len(label) // 2
        fits = free_from is None or start >= free_from
        kept.append(label if fits else "")
        if fits:
            free_from = start + len(label) + 1
    return kept


def routing_changes_at(text: TextResult, position: int) -> tuple[RoutingChange, ...]:
    """The MoE routing changes of one token of a text (one per layer whose router chose otherwise)."""
    return tuple(change for change in text.routing_changes if change.position == position)


def decade_ticks(log10_values) -> tuple[list[int], list[str]]:
    """Whole decades spanning the given log10 values (None skipped), labelled 1e-3, 1e-2..."""
    values = [v for v in log10_values if v is not None]
    if not values:
        return [], []
    decades = list(range(math.floor(min(values)), math.ceil(max(values)) + 1))
    return decades, [f"1e{d}" for d in decades]


def thinned(ticks: list, labels: list[str], room: int) -> tuple[list, list[str]]:
    """At most `room` of the ticks, every k-th from the last down, the first always kept: each label then
    gets a row (or column) of its own instead of the chart dropping some of them where they collide."""
    if len(ticks) <= room:
        return list(ticks), list(labels)
    step = -(-(len(ticks) - 1) // max(room - 1, 1))
    kept = sorted({0, *range(len(ticks) - 1, 0, -step)})
    return [ticks[i] for i in kept], [labels[i] for i in kept]


def round_ticks(top: float, most: int) -> list[float]:
    """Evenly spaced round ticks from 0 to at least `top` (steps of 1, 2 or 5 times a power of ten), at
    most `most` of them (2 at least: 0 and one above `top`)."""
    if not top > 0:
        return [0.0, 1.0]
    most = max(most, 2)
    power = 10.0 ** math.floor(math.log10(top / (most - 1)))
    for factor in (1, 2, 5, 10, 20, 50):
        step = factor * power
        count = math.ceil(top / step - 1e-9) + 1
        if count <= most:
            return [round(i * step, 12) for i in range(count)]
    return [0.0, round(math.ceil(top / (50 * power)) * 50 * power, 12)]


def divergent_cells(comparison: Comparison) -> list[tuple[int, int]]:
    """(text, position) of every divergent position (not allclose, or a top-1 flip), reading order."""
    return [
        (t.index, index)
        for t in comparison.texts
        for index, (close, flip) in enumerate(zip(t.columns.allclose, t.columns.top1_flip))
        if not close or flip
    ]


def describe_outcome(comparison: Comparison, batch_size: int) -> list[str]:
    """The status line's account of a run, most important first: how many texts diverge and flip, the
    invariant mode's verdict, the batch size actually used when there are fewer texts than it, and what
    usually reveals a divergence when none showed."""
    summary = comparison.summary
    parts = [f"{summary.diverged}/{summary.texts} texts diverge · {summary.top1_flips} flips"]
    if comparison.config.get("invariant"):
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
    length = len(comparison.texts[text].positions)
    return text, min(max(position, 0), max(length - 1, 0))


def log2_positions(batch_sizes) -> list[float]:
    """Where batch sizes sit on a log2 axis: 1, 2, 4, 8... equally spaced."""
    return [math.log2(b) for b in batch_sizes]


def sweep_series(cells) -> dict[str, tuple[list[int], list[float | None]]]:
    """Per dtype: batch sizes and log10 of the largest max|Δ| over the other axes (None: all zero)."""
    worst: dict[str, dict[int, float]] = {}
    for cell in cells:
        if cell.max_abs_diff is not None:
            by_batch = worst.setdefault(cell.dtype, {})
            by_batch[cell.batch_size] = max(by_batch.get(cell.batch_size, 0.0), cell.max_abs_diff)
    return {
        dtype: (sorted(by_batch), [math.log10(by_batch[b]) if by_batch[b] > 0 else None for b in sorted(by_batch)])
        for dtype, by_batch in worst.items()
    }
