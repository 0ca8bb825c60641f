"""`batchtui sweep`: the comparison over a grid of dtype x batch size x attention x padding side."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BatchtuiError, Cancelled, InputError
from ..numbers.generation_result import GenerationSummary
from ..settings import Settings
from ..visible import literal


@dataclass(frozen=True)
class SweepCell:
    dtype: str
    batch_size: int
    attn: str
    padding_side: str
    texts: int
    diverged: int | None  # None when the cell could not run (see error), or in generate mode
    max_abs_diff: float | None  # in generate mode, of the next-token logits up to each split
    top1_flips: int | None
    error: str | None = None
    # Generate mode (`sweep --generate`): continuations that differ, and of those, splits at a near-tie.
    differ: int | None = None
    near_ties: int | None = None


def parse_names(value: str) -> list[str]:
    """A comma-separated list (`bfloat16,float32`), blanks dropped."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise InputError(f"expected a comma-separated list, not {value!r}")
    return items


def parse_counts(value: str, what: str) -> list[int]:
    """Comma-separated positive integers (`1,2,4,8`): batch sizes, concurrency levels..."""
    try:
        counts = [int(item) for item in parse_names(value)]
    except ValueError:
        raise InputError(f"{what} must be comma-separated integers, not {value!r}") from None
    if any(count < 1 for count in counts):
        raise InputError(f"{what} must be 1 or more, not {value!r}")
    return counts


def parse_batch_sizes(value: str) -> list[int]:
    return parse_counts(value, "batch sizes")


def sweep_grid(settings: Settings, dtypes, batch_sizes, attns, padding_sides) -> list[Settings]:
    """Every combination, in a stable order (dtype outermost, padding side innermost)."""
    return [
        settings.with_changes(dtype=d, batch_size=b, attn=None if a == "default" else a, padding_side=p)
        for d, b, a, p in itertools.product(dtypes, batch_sizes, attns, padding_sides)
    ]


def sweep(
    texts: list[str],
    grid: list[Settings],
    compare_fn,  # compare, or generate_and_compare (generate mode)
    progress: Callable[[int, int, SweepCell], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[SweepCell]:
    """Each cell of the grid in turn; `progress(done, total, cell)` after each with the cell just measured
    (its attention as the model resolved it: `sdpa`, not `default`)."""
    cells = []
    for done, cell_settings in enumerate(grid, start=1):
        if cancelled is not None and cancelled():
            raise Cancelled("sweep cancelled")
        try:
            result = compare_fn(texts, cell_settings, cancelled=cancelled)
            cells.append(_cell(cell_settings, result.config["attn"], len(texts), **_counts(result.summary)))
        except Cancelled:
            raise
        except BatchtuiError as exc:  # one cell that cannot run (a dtype the device lacks) is reported
            cells.append(_cell(cell_settings, cell_settings.attn or "default", len(texts), error=literal(str(exc))))
        if progress is not None:
            progress(done, len(grid), cells[-1])
    return cells


def describe_cell(cell: SweepCell) -> str:
    return f"{cell.dtype} batch {cell.batch_size} {cell.attn} {cell.padding_side} padding"


def sweep_summary(cells: list[SweepCell]) -> str:
    """One line: how many cells diverge (or have continuations that differ), the worst, the ones that
    could not run, and the dtypes allclose (the same) in every cell, with their largest difference where allclose is
    not the same bits."""
    ran = [c for c in cells if c.error is None]
    generate = any(c.differ is not None for c in ran)
    bad = [c for c in ran if (c.differ if generate else c.diverged)]
    said = "have continuations that differ" if generate else "diverge"
    parts = [f"{len(bad)} of {len(cells)} cells {said}"]
    if bad:
        worst = max(bad, key=lambda c: c.max_abs_diff or 0.0)
        texts, flips = worst.diverged, worst.top1_flips
        figures = (
            f"{worst.differ} differ"
            if generate
            else f"{texts} text{'s' * (texts != 1)}, {flips} flip{'s' * (flips != 1)}"
        )
        parts.append(f"worst {describe_cell(worst)}: max|Δ| {worst.max_abs_diff:.3g} ({figures})")
    clean = [d for d in dict.fromkeys(c.dtype for c in ran) if not any(c.dtype == d for c in bad)]
    if clean and bad:
        verdict = f"{', '.join(clean)} {'the same' if generate else 'allclose'} in every cell"
        largest = max((c.max_abs_diff or 0.0) for c in ran if c.dtype in clean)
        if not generate and largest > 0:  # allclose is not the same bits: say where the bits are judged
            verdict += f" (not bitwise: max|Δ| {largest:.3g}; --bitwise judges every bit)"
        parts.append(verdict)
    failed = len(cells) - len(ran)
    if failed:
        parts.append(f"{failed} could not run")
    return " · ".join(parts)


def _counts(summary) -> dict:
    """A cell's figures from a comparison's summary, or from a generation's."""
    if isinstance(summary, GenerationSummary):
        return {"differ": summary.differ, "near_ties": summary.near_ties, "max_abs_diff": summary.max_abs_diff}
    return {"diverged": summary.diverged, "max_abs_diff": summary.max_abs_diff, "top1_flips": summary.top1_flips}


def _cell(settings: Settings, attn: str, texts: int, **figures) -> SweepCell:
    figures = {"diverged": None, "max_abs_diff": None, "top1_flips": None, **figures}
    return SweepCell(settings.dtype, settings.batch_size, attn, settings.padding_side, texts, **figures)
