"""Matmuls whose result for one row does not depend on how many rows share the call.

A GEMM library blocks and threads a call by its shape: on CPU a call of a few rows goes to other kernels than
one of hundreds, and on CUDA cuBLAS picks a kernel per shape. So a token's row of a linear layer can round
differently inside a padded batch than alone. While `RowInvariantMatmuls` is entered, aten's mm, addmm, bmm,
baddbmm and _grouped_mm (MoE experts) are re-registered so that every row meets one kernel and one reduction
order whatever the call's height:
- where this machine's library was measured to give a row the same bits in any call of h or more rows
  (`_row_keeping_height`, per shape, dtype and layout: often h is 1 or 2, as only its one-row kernels differ),
  a call of h or more rows goes to the library whole and a shorter one is padded with zero rows to h;
- elsewhere (and always on CUDA, where cuBLAS picks kernels per shape) every row is computed in a call of
  exactly `tile_rows(device)` rows: shorter calls padded, taller ones cut into tiles.
The replacements call the `out=` overloads, which are separate operators: calling `torch.mm` from the mm
override would call the override again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from .scopes import ScopedKernels

# The dispatch keys the replacements are registered for: the mechanism is not CPU-specific.
_DEVICE_KEYS = ("CPU", "CUDA")
_CPU_TILE_ROWS = 16
# Kernel launches cost more than padding on a GPU: taller tiles there.
_GPU_TILE_ROWS = 64


def tile_rows(device: torch.device) -> int:
    """The fixed call height every row is computed in on `device`."""
    return _CPU_TILE_ROWS if device.type == "cpu" else _GPU_TILE_ROWS


# (op, dtype, shape and layout of everything but the rows, threads) -> the height from which the library keeps
# rows
_measured: dict[tuple, int | None] = {}
_measured_lock = threading.Lock()

RowsFn = Callable[[torch.Tensor], torch.Tensor]  # rows of the row operand -> those rows of the result


def _padded(rows: torch.Tensor, height: int, dim: int) -> torch.Tensor:
    missing = height - rows.shape[dim]
    if missing == 0:
        return rows
    shape = list(rows.shape)
    shape[dim] = missing
    return torch.cat([rows, rows.new_zeros(shape)], dim=dim)


def _by_rows(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> torch.Tensor:
    """`compute(a)` with every row of `a` (along `dim`) getting the bits it gets in a call of one fixed height:
    a shorter call padded to that height, a taller one through the library where it keeps rows (measured),
    else in tiles of the fixed height."""
    m = a.shape[dim]
    if m == 0 or not RowInvariantMatmuls.active():  # another thread's call: the library's own
        return compute(a)
    floor = _row_keeping_height(a, dim, key, compute)
    if floor is not None:
        return compute(a) if m >= floor else compute(_padded(a, floor, dim)).narrow(dim, 0, m).clone()
    height = tile_rows(a.device)
    if m <= height:
        return compute(_padded(a, height, dim)).narrow(dim, 0, m).clone()
    tiles = [compute(_padded(a.narrow(dim, s, min(height, m - s)), height, dim)) for s in range(0, m, height)]
    return torch.cat(tiles, dim=dim).narrow(dim, 0, m)


# The call heights tried, smallest first: a library often takes other kernels for one row or a few.
_FLOORS = (1, 2, 4, 8, 16)


def _row_keeping_height(a: torch.Tensor, dim: int, key: tuple, compute: RowsFn) -> int | None:
    """The smallest height h such that, measured once per key on random rows, the library gives every row of a
    call of h or more rows the bits that row gets in a call of exactly h rows (wherever it sits); None when not
    even 16 rows do, and always on CUDA, where cuBLAS picks kernels per shape (then: fixed-height tiles)."""
    if a.device.type != "cpu":
        return None
    # The library blocks a call by its thread count too, and that count is per thread (the app's workers run
    # with one core fewer than the main thread): a measurement holds for one count only.
    threads = torch.get_num_threads()
    key = (key, a.dtype, tuple(a.shape[:dim]), tuple(a.shape[dim + 1 :]), a.stride(-1) == 1, threads)
    with _measured_lock:
        if key in _measured:
            return _measured[key]
    shape = list(a.shape)
    shape[dim] = 67
    probe = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(a.dtype)
    floor = next((h for h in _FLOORS if _keeps_rows_from(h, probe, dim, compute)), None)
    with _measured_lock:
        _measured[key] = floor
    return floor


def _keeps_rows_from(height: int, probe: torch.Tensor, dim: int, compute: RowsFn) -> bool:
    """Do the first and the last `height` rows of calls of several heights above `height` get the bits of a
    `height`-row call of just those rows?"""
    for rows in sorted({height + 1, height + 2, 2 * height + 1, 3 * height + 2, 17, 40, probe.shape[dim]}):
        whole = compute(probe.narrow(dim, 0, rows))
        for start in (0, rows - height):
            alone = compute(probe.narrow(dim, start, height))
            if not torch.equal(whole.narrow(dim, start, height), alone):
                return False
    return True


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def compute(rows):
        return torch.ops.aten.mm.out(rows, b, out=rows.new_empty((rows.shape[0], b.shape[1])))

    return _by_rows(a, 0, ("mm", tuple(b.shape), b.stride()), compute)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if bias.dim() == 2 and bias.shape[0] != 1 and RowInvariantMatmuls.active():
        # A bias with a row per row: the product row-invariant, the (element-wise) sum after it.
        return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), _mm(a, b), alpha=alpha)

    def compute(rows):
        out = rows.new_empty((rows.shape[0], b.shape[1]))
        return torch.ops.aten.addmm.out(bias, rows, b, beta=beta, alpha=alpha, out=out)

    return _by_rows(a, 0, ("addmm", tuple(b.shape), b.stride(), tuple(bias.shape), beta, alpha), compute)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def compute(rows):
        return torch.ops.aten.bmm.out(rows, b, out=rows.new_empty((rows.shape[0], rows.shape[1], b.shape[2])))

    return _by_rows(a, 1, ("bmm", tuple(b.shape), b.stride()), compute)


def _baddbmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    if not RowInvariantMatmuls.active():
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        return torch.ops.aten.baddbmm.out(bias, a, b, beta=beta, alpha=alpha, out=out)
    # The bias may vary along the rows: product first (row-invariant), then the element-wise sum.
    product = _bmm(a, b)
    if beta == 0:
        return torch.ops.aten.mul(product, alpha)
    return torch.ops.aten.add(torch.ops.aten.mul(bias, beta), product, alpha=alpha)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """MoE experts: token rows grouped by expert (`offs`: each group's end), each group through `_mm`, so a
    token's row does not depend on how many other tokens its expert got. (In a thread outside the mode: one
    library mm per group, which is what ATen's CPU kernel computes.)"""
    if bias is not None or a.dim() != 2 or b.dim() != 3 or offs is None:
        raise NotImplementedError("batch-invariant mode covers _grouped_mm of 2-D tokens by 3-D expert weights")
    ends = offs.tolist()
    starts = [0, *ends[:-1]]
    dtype = out_dtype or a.dtype
    out = a.new_zeros((a.shape[0], b.shape[2]), dtype=dtype)
    for expert, (start, end) in enumerate(zip(starts, ends)):
        if end > start:
            out[start:end] = _mm(a[start:end], b[expert]).to(dtype)
    return out


_REPLACEMENTS = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm, "_grouped_mm": _grouped_mm}


class RowInvariantMatmuls(ScopedKernels):
    """aten's matmuls replaced, on CPU and CUDA, while entered."""

    def kernels(self) -> dict:
        return {(name, key): fn for name, fn in _REPLACEMENTS.items() for key in _DEVICE_KEYS}
