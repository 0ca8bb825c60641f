"""`batchtui sweep`: the comparison over a grid of dtype x batch size x attention x padding side."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from .errors import BatchtuiError, Cancelled, InputError
from .settings import Settings


@dataclass(frozen=True)
class SweepCell:
    dtype: str
    batch_size: int
    attn: str
    padding_side: str
    texts: int
    diverged: int | None  # None when the cell could not run (see error)
    max_abs_diff: float | None
    top1_flips: int | None
    error: str | None = None


def parse_names(value: str) -> list[str]:
    """A comma-separated list (`bfloat16,float32`), blanks dropped."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if not items:
        raise InputError(f"expected a comma-separated list, not {value!r}")
    return items


def parse_batch_sizes(value: str) -> list[int]:
    """Comma-separated batch sizes (`1,2,4,8`), each a positive integer."""
    try:
        sizes = [int(item) for item in parse_names(value)]
    except ValueError:
        raise InputError(f"batch sizes must be comma-separated integers, not {value!r}") from None
    if any(size < 1 for size in sizes):
        raise InputError(f"batch sizes must be 1 or more, not {value!r}")
    return sizes


def sweep_grid(settings: Settings, dtypes, batch_sizes, attns, padding_sides) -> list[Settings]:
    """Every combination, in a stable order (dtype outermost, padding side innermost)."""
    return [
        settings.with_changes(dtype=d, batch_size=b, attn=None if a == "default" else a, padding_side=p)
        for d, b, a, p in itertools.product(dtypes, batch_sizes, attns, padding_sides)
    ]


def sweep(
    texts: list[str],
    grid: list[Settings],
    compare_fn,
    progress: Callable[[int, int, Settings], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[SweepCell]:
    cells = []
    for done, cell_settings in enumerate(grid, start=1):
        if cancelled is not None and cancelled():
            raise Cancelled("sweep cancelled")
        try:
            result = compare_fn(texts, cell_settings, cancelled=cancelled)
            s = result.summary
            attn = result.config["attn"]
            cells.append(_cell(cell_settings, attn, len(texts), s.diverged, s.max_abs_diff, s.top1_flips))
        except Cancelled:
            raise
        except BatchtuiError as exc:  # one cell that cannot run (a dtype the device lacks) is reported
            cells.append(_cell(cell_settings, cell_settings.attn or "default", len(texts), error=str(exc)))
        if progress is not None:
            progress(done, len(grid), cell_settings)
    return cells


def _cell(settings: Settings, attn: str, texts: int, diverged=None, max_abs=None, flips=None, error=None) -> SweepCell:
    return SweepCell(
        settings.dtype, settings.batch_size, attn, settings.padding_side, texts, diverged, max_abs, flips, error
    )
