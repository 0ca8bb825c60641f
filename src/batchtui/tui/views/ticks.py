"""Ticks and series for the charts: decades, thinned and round ticks, the sweep's curves."""

from __future__ import annotations

import math


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
