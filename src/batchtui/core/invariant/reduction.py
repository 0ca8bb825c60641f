"""Reductions over a row's last dims (an RMSNorm's mean, a vector norm) whose result does not depend on how
many rows share the call.

CUDA's reduction kernel lays out its threads by the number of outputs (with few rows, more threads share a
row, and a long row is split across blocks), so a row's sum can round otherwise alone (a decode step of one
text) than among others. On CPU a call past the parallel grain is split across threads, and one row alone of
that size (reduced in two passes) differently again. While `RowInvariantReductions` is entered, aten's sum, mean and
linalg_vector_norm over trailing dims of floating tensors go through `rows.by_rows` on the rows they
leave: every row meets one configuration whatever the call's height. Other reductions (over the batch, of
integers, of everything) are the library's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .rows import DEVICE_KEYS, by_rows
from .scopes import ScopedKernels


def _trailing(x: torch.Tensor, dims) -> int | None:
    """How many trailing dims `dims` names (all of them, leaving at least one row dim), else None."""
    if dims is None or x.dim() < 2:
        return None
    named = sorted({d % x.dim() for d in ([dims] if isinstance(dims, int) else dims)})
    count = len(named)
    return count if 0 < count < x.dim() and named == list(range(x.dim() - count, x.dim())) else None


# The size below which ATen reduces on one thread (at::internal::GRAIN_SIZE), a row as in any other such call.
_GRAIN = 32768


def _reduced(op, x: torch.Tensor, dims, keepdim: bool, dtype, key: tuple, *before) -> torch.Tensor:
    """`op(x, *before, dims, keepdim, dtype=dtype)`, each row of the dims it leaves reduced as in a call of one fixed
    height. `op` is a binding called with `out=` (the out overload: a separate operator, not replaced, and a third of
    the cost of `torch.ops.aten.<op>.out`)."""
    # Below the grain (or on one thread) ATen reduces every row on one thread, a row as in any other such call: the
    # library's own, checked first (every norm of every pass comes here).
    if (
        (x.is_cpu and (x.numel() < _GRAIN or torch.get_num_threads() == 1))
        or not x.is_floating_point()
        or (count := _trailing(x, dims)) is None
        or not RowInvariantReductions.active()
    ):
        return op(x, *before, dims, keepdim, dtype=dtype, out=_out(x, dtype))
    lead = tuple(x.shape[: x.dim() - count])
    rows = x.reshape(math.prod(lead), math.prod(x.shape[x.dim() - count :]))
    reduced = by_rows(rows, 0, key, lambda r: op(r, *before, [1], False, dtype=dtype, out=_out(r, dtype)))
    return reduced.reshape(lead + (1,) * count if keepdim else lead)


def _out(x: torch.Tensor, dtype) -> torch.Tensor:
    # Resized by the out= overload; an integral input sums to int64 as the functional form does.
    return x.new_empty((0,), dtype=dtype or (x.dtype if x.is_floating_point() else torch.int64))


def _sum(x, dim=None, keepdim=False, *, dtype=None):
    return _reduced(torch.sum, x, dim, keepdim, dtype, ("sum", dtype))


def _mean(x, dim=None, keepdim=False, *, dtype=None):
    return _reduced(torch.mean, x, dim, keepdim, dtype, ("mean", dtype))


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _reduced(torch.linalg.vector_norm, x, dim, keepdim, dtype, ("norm", ord, dtype), ord)


_REPLACEMENTS = {"sum.dim_IntList": _sum, "mean.dim": _mean, "linalg_vector_norm": _vector_norm}


def _row_kind(x: torch.Tensor, dims) -> tuple | None:
    """What makes a CPU reduction need nothing from the mode whatever the batch: of integers or over other dims
    than the trailing ones (the library's own in the mode too), or over rows shorter than the grain (only a call of
    one row that long is split across threads; a row among others is reduced whole). None where it may."""
    if not x.is_floating_point() or (count := _trailing(x, dims)) is None:
        return ("library",)
    row = math.prod(x.shape[x.dim() - count :])
    return ("row", row) if row < _GRAIN else None


# op -> what makes a call of it (its arguments) need nothing whatever the batch, None where it may
_NEEDLESS_ON_CPU: dict[str, Callable] = {
    "sum.dim_IntList": lambda x, dim=None, *args, **kwargs: _row_kind(x, dim),
    "mean.dim": lambda x, dim=None, *args, **kwargs: _row_kind(x, dim),
    "linalg_vector_norm": lambda x, ord=2, dim=None, *args, **kwargs: _row_kind(x, dim),
}


class RowInvariantReductions(ScopedKernels):
    """aten's sum, mean and vector norm over trailing dims replaced, on CPU and CUDA, while entered."""

    needless_on_cpu = _NEEDLESS_ON_CPU

    def kernels(self) -> dict:
        return {(name, key): fn for name, fn in _REPLACEMENTS.items() for key in DEVICE_KEYS}
