"""What a view needs from a `Comparison`, ready to draw: colour buckets, curves, navigation.

Torch-free and pure, so the TUI computes no numbers of its own and these are tested directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .comparison import Comparison, LayerMetrics, RoutingChange, TextResult

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
    """All cells of one colour bucket, top-1 flips apart: x = token position, y = text row (1-based)."""

    bucket: int
    positions: tuple[int, ...]
    texts: tuple[int, ...]
    flips: bool = False  # these cells are top-1 flips (drawn with their own glyph)


def heatmap_series(comparison: Comparison, first_position: int = 0, last_position: int | None = None):
    """Cells grouped by bucket and by whether they flip, restricted to positions [first_position, last_position]."""
    cells: dict[tuple[int, bool], tuple[list[int], list[int]]] = {}
    stop = None if last_position is None else last_position + 1
    for text in comparison.texts:  # from the columns: no per-position objects are built
        window = zip(text.columns.max_abs_diff[first_position:stop], text.columns.top1_flip[first_position:stop])
        for index, (max_abs_diff, flip) in enumerate(window, start=first_position):
            xs, ys = cells.setdefault((bucket_of(max_abs_diff), flip), ([], []))
            xs.append(index)
            ys.append(text.index + 1)
    return [HeatmapSeries(bucket, tuple(xs), tuple(ys), flip) for (bucket, flip), (xs, ys) in sorted(cells.items())]


@dataclass(frozen=True)
class LayerCurve:
    """Per-layer (or per-module) divergence of one text as log10(max|Δ|); bitwise-equal ones apart."""

    names: tuple[str, ...]
    log10_max_abs_diff: tuple[float | None, ...]  # None where the module is bitwise equal (or 0)
    rel_l2: tuple[float, ...]
    first_divergent: str | None
    tick_indices: tuple[int, ...]  # where to label the x axis: embeddings, each layer's output, norm
    tick_labels: tuple[str, ...]  # a short label per module: "emb", the layer's number, "norm", "out"


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
    )


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


def divergent_cells(comparison: Comparison) -> list[tuple[int, int]]:
    """(text, position) of every divergent position (not allclose, or a top-1 flip), reading order."""
    return [
        (t.index, index)
        for t in comparison.texts
        for index, (close, flip) in enumerate(zip(t.columns.allclose, t.columns.top1_flip))
        if not close or flip
    ]


def describe_outcome(comparison: Comparison, batch_size: int) -> str:
    """The status line's account of a run: how many texts diverge and flip, the batch size actually used
    when there are fewer texts than it, and what usually reveals a divergence when none showed."""
    summary = comparison.summary
    parts = [f"{summary.diverged}/{summary.texts} texts diverge · {summary.top1_flips} flips"]
    if batch_size > summary.texts:
        parts.append(f"effective batch size {summary.texts} (of {batch_size}: {summary.texts} texts)")
    if summary.diverged == 0 and summary.top1_flips == 0:
        parts.append("no divergence: right padding (p), arange positions (o) or another dtype (d) usually shows one")
    return " · ".join(parts)


# The summary's orders: the texts' own, then worst first by each measure.
SUMMARY_ORDERS = ("text", "max|Δ|", "flips", "KL")


def summary_order(comparison: Comparison, order: str) -> list[int]:
    """Text indices in the order the summary lists them (worst first; ties keep the texts' order)."""
    key = {
        "text": lambda t: 0,
        "max|Δ|": lambda t: -t.max_abs_diff,
        "flips": lambda t: -t.top1_flips,
        "KL": lambda t: -t.kl_max,
    }[order]
    return [t.index for t in sorted(comparison.texts, key=lambda t: (key(t), t.index))]


def flip_cells(comparison: Comparison) -> list[tuple[int, int]]:
    """(text, position) of every top-1 flip, reading order."""
    return [(t.index, i) for t in comparison.texts for i, flip in enumerate(t.columns.top1_flip) if flip]


def next_flip(comparison: Comparison, text: int, position: int, forward: bool = True) -> tuple[int, int] | None:
    """The next (or previous) top-1 flip after (text, position), across texts, wrapping; None if none."""
    return _next_in(flip_cells(comparison), (text, position), forward)


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
